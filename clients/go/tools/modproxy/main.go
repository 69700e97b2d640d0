// Command modproxy writes one version of a Go module, made from the files
// of a git work tree, in the layout of a module proxy
// (GOPROXY=file://OUT): the list, .info, .mod and .zip files the go command
// downloads for that version once it is tagged.
//
//	modproxy -dir clients/go -version v0.1.0 -out /tmp/proxy
//
// The files are those git would commit (tracked and untracked, less what
// .gitignore ignores: build tools, test binaries), so a check made before a
// commit sees the module its tag will serve. The zip is made by
// golang.org/x/mod/zip, the go command's own rules: a file the proxy would
// leave out or refuse is left out or refused here too.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	modzip "golang.org/x/mod/zip"
)

func main() {
	dir := flag.String("dir", ".", "the module's root directory (holds its go.mod), in a git work tree")
	version := flag.String("version", "", "the version to write (vX.Y.Z)")
	out := flag.String("out", "", "the proxy's root directory")
	flag.Parse()
	if *version == "" || *out == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*dir, *version, *out); err != nil {
		log.Fatalf("modproxy: %v", err)
	}
}

func run(dir, version, out string) error {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return err
	}
	mod := module.Version{Path: modfile.ModulePath(gomod), Version: version}
	if mod.Path == "" {
		return fmt.Errorf("%s/go.mod names no module", dir)
	}
	if err := module.Check(mod.Path, mod.Version); err != nil {
		return err
	}
	files, err := workTreeFiles(dir)
	if err != nil {
		return err
	}
	var zip bytes.Buffer
	if err := modzip.Create(&zip, mod, files); err != nil {
		return err
	}

	escaped, err := module.EscapePath(mod.Path)
	if err != nil {
		return err
	}
	at := filepath.Join(out, filepath.FromSlash(escaped), "@v")
	if err := os.MkdirAll(at, 0o755); err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return err
	}
	list, err := os.ReadFile(filepath.Join(at, "list"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(list))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	for name, data := range map[string][]byte{
		version + ".info": info,
		version + ".mod":  gomod,
		version + ".zip":  zip.Bytes(),
		"list":            []byte(strings.Join(versions, "\n") + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(at, name), data, 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("%s@%s: %d files, %d bytes zipped, in %s\n", mod.Path, version, len(files), zip.Len(), at)
	return nil
}

// workTreeFiles lists the module's files as git would commit them, less
// those of nested modules (a directory with a go.mod of its own is another
// module, as this tool's own directory is).
func workTreeFiles(dir string) ([]modzip.File, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", ".")
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	listing, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s: %w", dir, err)
	}
	var names []string
	seen := map[string]bool{}
	nested := map[string]bool{}
	for _, name := range strings.Split(string(listing), "\x00") {
		// A file with a merge conflict is listed once per stage.
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		// Tracked but deleted in the work tree: not in the next commit.
		if _, err := os.Lstat(filepath.Join(dir, name)); errors.Is(err, fs.ErrNotExist) {
			continue
		}
		names = append(names, name)
		if path.Base(name) == "go.mod" && path.Dir(name) != "." {
			nested[path.Dir(name)] = true
		}
	}
	var files []modzip.File
	for _, name := range names {
		inNested := false
		for d := path.Dir(name); d != "."; d = path.Dir(d) {
			if nested[d] {
				inNested = true
				break
			}
		}
		if !inNested {
			files = append(files, file{dir: dir, name: name})
		}
	}
	return files, nil
}

// file is one file of the work tree, as golang.org/x/mod/zip reads it.
type file struct{ dir, name string }

func (f file) Path() string                 { return f.name }
func (f file) Lstat() (os.FileInfo, error)  { return os.Lstat(filepath.Join(f.dir, f.name)) }
func (f file) Open() (io.ReadCloser, error) { return os.Open(filepath.Join(f.dir, f.name)) }

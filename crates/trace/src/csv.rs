//! The CSV trace format: [`CsvReader`] and [`CsvWriter`].
//!
//! Plain text that users can produce from their own storage logs:
//!
//! ```text
//! # blockalloc trace
//! # block_size=4096
//! # capacity_bytes=1073741824
//! # workload=seed
//! op,object,bytes
//! alloc,0,40960
//! alloc,1,1048576
//! free,0,
//! round,,1
//! ```
//!
//! * One operation per line: `alloc,<object>,<bytes>`, `free,<object>` (a
//!   third field is allowed and ignored), `round` (a round marker; an
//!   optional third field is the workload phase, default 1).
//! * Objects are decimal or `0x`-prefixed hexadecimal `u64` ids (so `malloc`
//!   addresses from a log work as they are). Sizes are bytes, with optional
//!   units (`4096`, `4KiB`, `1.5MiB`).
//! * The header line `op,object,bytes` is optional. Blank lines are skipped.
//!   Fields are trimmed; op names are case-insensitive. CRLF line ends read
//!   as LF ones.
//! * A file without operations (empty, or comments and the header line
//!   only) is a valid, empty trace.
//! * Lines starting with `#` are comments. Comments of the form
//!   `# key=value` *before the first operation* are the trace's metadata;
//!   `block_size` and `capacity_bytes` fill [`TraceHeader`]'s fields, which
//!   `replay` uses as defaults.
//!
//! Errors name the line.

use std::io::{BufRead, Write};

use blockalloc::{ByteSize, GeometryError};

use crate::error::TraceError;
use crate::op::{step_item, valid_key, TraceHeader, TraceOp, MAX_PHASE};

/// The optional header line.
pub const CSV_HEADER: &str = "op,object,bytes";
/// Metadata key for [`TraceHeader::block_size`].
pub const KEY_BLOCK_SIZE: &str = "block_size";
/// Metadata key for [`TraceHeader::capacity_bytes`].
pub const KEY_CAPACITY: &str = "capacity_bytes";

/// Reads a CSV trace line by line.
#[derive(Debug)]
pub struct CsvReader<R: BufRead> {
    input: R,
    header: TraceHeader,
    line: String,
    line_no: u64,
    /// The first operation, read while looking for the metadata's end.
    pending: Option<TraceOp>,
    done: bool,
}

/// Characters of a field quoted in an error: a 10 MB field must not become
/// a 10 MB message.
pub const QUOTE_CHARS: usize = 40;

/// `field` quoted for an error message: at most [`QUOTE_CHARS`] characters,
/// then `…` when there were more.
pub fn quote(field: &str) -> String {
    match field.char_indices().nth(QUOTE_CHARS) {
        None => format!("{field:?}"),
        Some((cut, _)) => format!("{:?}…", &field[..cut]),
    }
}

/// A size field, with units; errors quote the field by its prefix only.
fn parse_size(what: &str, field: &str) -> Result<u64, String> {
    field
        .parse::<ByteSize>()
        .map(ByteSize::bytes)
        .map_err(|e| match e {
            GeometryError::BadSize { reason, .. } => {
                format!("{what} {} is not a size: {reason}", quote(field))
            }
            other => format!("{what} {}: {other}", quote(field)),
        })
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(&hex.replace('_', ""), 16).ok(),
        None => s.replace('_', "").parse().ok(),
    }
}

impl<R: BufRead> CsvReader<R> {
    /// Reads the metadata comments and the optional header line.
    ///
    /// # Errors
    /// [`TraceError::Csv`] for a malformed line or metadata value,
    /// [`TraceError::Io`].
    pub fn new(input: R) -> Result<Self, TraceError> {
        let mut r = CsvReader {
            input,
            header: TraceHeader::default(),
            line: String::new(),
            line_no: 0,
            pending: None,
            done: false,
        };
        loop {
            if !r.read_line()? {
                r.done = true;
                break;
            }
            let line = r.line.trim();
            if line.is_empty() {
                continue;
            }
            if let Some(comment) = line.strip_prefix('#') {
                r.metadata(comment.trim().to_string())?;
                continue;
            }
            if line.replace(' ', "").eq_ignore_ascii_case(CSV_HEADER) {
                continue;
            }
            r.pending = Some(r.parse()?);
            break;
        }
        Ok(r)
    }

    fn read_line(&mut self) -> Result<bool, TraceError> {
        self.line.clear();
        match self.input.read_line(&mut self.line) {
            Ok(0) => Ok(false),
            Ok(_) => {
                self.line_no += 1;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                self.line_no += 1;
                Err(self.error("not UTF-8 text (a damaged binary trace?)".into()))
            }
            Err(e) => Err(TraceError::io(None, e)),
        }
    }

    fn error(&self, message: String) -> TraceError {
        TraceError::Csv {
            line: self.line_no,
            message,
        }
    }

    fn metadata(&mut self, comment: String) -> Result<(), TraceError> {
        let Some((k, v)) = comment.split_once('=') else {
            return Ok(()); // a plain comment
        };
        let (k, v) = (k.trim(), v.trim());
        if !valid_key(k) {
            return Ok(()); // prose that happens to contain '='
        }
        let size = |v: &str| parse_size(k, v).map_err(|e| self.error(e));
        match k {
            KEY_BLOCK_SIZE => {
                let bs = size(v)?;
                self.header.block_size = Some(bs);
                self.header
                    .validate()
                    .map_err(|e| self.error(e.to_string()))?;
            }
            KEY_CAPACITY => self.header.capacity_bytes = Some(size(v)?).filter(|&c| c > 0),
            _ => self.header.set(k, v),
        }
        Ok(())
    }

    fn parse(&self) -> Result<TraceOp, TraceError> {
        let line = self.line.trim();
        let mut fields = line.split(',').map(str::trim);
        let op = fields.next().unwrap_or("");
        let object = fields.next().unwrap_or("");
        let bytes = fields.next().unwrap_or("");
        if fields.next().is_some() {
            return Err(self.error(format!(
                "{} has more than 3 fields (expected op,object,bytes)",
                quote(line)
            )));
        }
        let object_id = || {
            parse_u64(object).ok_or_else(|| {
                self.error(format!(
                    "object {} is not a u64 (decimal or 0x-hex)",
                    quote(object)
                ))
            })
        };
        match op.to_ascii_lowercase().as_str() {
            "alloc" => {
                let object = object_id()?;
                if bytes.is_empty() {
                    return Err(self.error("alloc needs a size in bytes".into()));
                }
                let bytes = parse_size("size", bytes).map_err(|e| self.error(e))?;
                Ok(TraceOp::Alloc { object, bytes })
            }
            "free" => Ok(TraceOp::Free {
                object: object_id()?,
            }),
            "round" => {
                let phase = if bytes.is_empty() {
                    1
                } else {
                    bytes
                        .parse::<u8>()
                        .ok()
                        .filter(|&p| p <= MAX_PHASE)
                        .ok_or_else(|| {
                            self.error(format!(
                                "round phase {} is not 0..={MAX_PHASE}",
                                quote(bytes)
                            ))
                        })?
                };
                Ok(TraceOp::RoundEnd { phase })
            }
            _ => Err(self.error(format!(
                "unknown operation {} (expected alloc, free or round)",
                quote(op)
            ))),
        }
    }

    /// The metadata read from the leading comments.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// Line number of the last line read (1-based).
    pub fn line(&self) -> u64 {
        self.line_no
    }

    fn step(&mut self) -> Result<Option<TraceOp>, TraceError> {
        if let Some(op) = self.pending.take() {
            return Ok(Some(op));
        }
        loop {
            if !self.read_line()? {
                return Ok(None);
            }
            let line = self.line.trim_start();
            if line.trim_end().is_empty() || line.starts_with('#') {
                continue;
            }
            return self.parse().map(Some);
        }
    }
}

impl<R: BufRead> Iterator for CsvReader<R> {
    type Item = Result<TraceOp, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done && self.pending.is_none() {
            return None;
        }
        let item = step_item(self.step(), &mut self.done);
        if let Some(Err(_)) = item {
            self.pending = None;
        }
        item
    }
}

/// Writes a CSV trace: metadata comments, the header line, one line per
/// operation.
#[derive(Debug)]
pub struct CsvWriter<W: Write> {
    out: W,
    ops: u64,
}

impl<W: Write> CsvWriter<W> {
    /// Writes the metadata and header line. Wrap files in a `BufWriter`.
    ///
    /// # Errors
    /// [`TraceError::BadHeader`], [`TraceError::Io`].
    pub fn new(mut out: W, header: &TraceHeader) -> Result<Self, TraceError> {
        header.validate()?;
        let mut text = String::from("# blockalloc trace (op,object,bytes)\n");
        if let Some(bs) = header.block_size {
            text.push_str(&format!("# {KEY_BLOCK_SIZE}={bs}\n"));
        }
        if let Some(c) = header.capacity_bytes {
            text.push_str(&format!("# {KEY_CAPACITY}={c}\n"));
        }
        for (k, v) in &header.meta {
            text.push_str(&format!("# {k}={v}\n"));
        }
        text.push_str(CSV_HEADER);
        text.push('\n');
        out.write_all(text.as_bytes())
            .map_err(|e| TraceError::io(None, e))?;
        Ok(CsvWriter { out, ops: 0 })
    }

    /// Appends one operation.
    ///
    /// # Errors
    /// [`TraceError::Io`].
    pub fn write(&mut self, op: TraceOp) -> Result<(), TraceError> {
        self.ops += 1;
        writeln!(self.out, "{op}").map_err(|e| TraceError::io(None, e))
    }

    /// Operations written.
    pub fn ops(&self) -> u64 {
        self.ops
    }

    /// Flushes and returns the output.
    ///
    /// # Errors
    /// [`TraceError::Io`].
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.out.flush().map_err(|e| TraceError::io(None, e))?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<(TraceHeader, Vec<TraceOp>), TraceError> {
        let r = CsvReader::new(text.as_bytes())?;
        let h = r.header().clone();
        Ok((h, r.collect::<Result<_, _>>()?))
    }

    #[test]
    fn reads_what_users_write() {
        let (h, ops) = read(
            "# from my log\n# block_size=4KiB\n# capacity_bytes=1GiB\n# host=a.example\n\
             OP, object, bytes\r\n\nalloc,1,100\nALLOC, 0x10 , 4KiB\n# mid comment=ignored\n\
             free,1,\nfree,0x10\nround\nround,,2\n",
        )
        .unwrap();
        assert_eq!(h.block_size, Some(4096));
        assert_eq!(h.capacity_bytes, Some(1 << 30));
        assert_eq!(h.get("host"), Some("a.example"));
        assert_eq!(h.get("mid comment"), None);
        assert_eq!(
            ops,
            vec![
                TraceOp::Alloc {
                    object: 1,
                    bytes: 100
                },
                TraceOp::Alloc {
                    object: 16,
                    bytes: 4096
                },
                TraceOp::Free { object: 1 },
                TraceOp::Free { object: 16 },
                TraceOp::RoundEnd { phase: 1 },
                TraceOp::RoundEnd { phase: 2 },
            ]
        );
        let (_, none) = read("").unwrap();
        assert!(none.is_empty());
        let (_, one) = read("alloc,0,0").unwrap();
        assert_eq!(one.len(), 1);
    }

    #[test]
    fn errors_name_the_line() {
        for (text, line, needle) in [
            ("op,object,bytes\nalloc,1\n", 2, "needs a size"),
            ("alloc,x,1\n", 1, "object \"x\""),
            ("alloc,1,1\nfree,-3,\n", 2, "object \"-3\""),
            ("alloc,1,12XB\n", 1, "size"),
            ("\n\nmove,1,2\n", 3, "unknown operation"),
            ("alloc,1,2,3\n", 1, "more than 3 fields"),
            ("round,,99\n", 1, "round phase"),
            ("# block_size=3000\n", 1, "block size"),
            ("alloc,99999999999999999999,1\n", 1, "not a u64"),
        ] {
            match read(text) {
                Err(TraceError::Csv { line: l, message }) => {
                    assert_eq!(l, line, "{text:?}: {message}");
                    assert!(message.contains(needle), "{text:?}: {message}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let bad = b"alloc,1,1\n\xff\xfe\n";
        let r = CsvReader::new(&bad[..]).unwrap();
        let e = r.collect::<Result<Vec<_>, _>>().unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn a_huge_field_is_quoted_by_a_short_prefix() {
        let huge = "9".repeat(10 << 20);
        for (text, needle) in [
            (format!("alloc,1,{huge}x\n"), "size"),
            (format!("alloc,{huge}x,1\n"), "object"),
            (format!("{huge}x,1,1\n"), "unknown operation"),
            (format!("round,,{huge}\n"), "round phase"),
            (format!("alloc,1,1,{huge}\n"), "more than 3 fields"),
            (format!("# block_size={huge}x\n"), "block_size"),
        ] {
            match read(&text) {
                Err(TraceError::Csv { line: 1, message }) => {
                    assert!(message.contains(needle), "{message}");
                    assert!(message.len() < 200, "{} bytes", message.len());
                    assert!(
                        message.contains(&format!("{}\"…", "9".repeat(30))),
                        "{message}"
                    );
                }
                other => panic!("{needle}: {:?}", other.map(|_| ())),
            }
        }
        assert_eq!(quote("short"), "\"short\"");
        assert_eq!(quote(&"é".repeat(41)), format!("{:?}…", "é".repeat(40)));
    }

    #[test]
    fn writes_what_it_reads() {
        let mut h = TraceHeader {
            block_size: Some(4096),
            capacity_bytes: Some(1 << 30),
            meta: Vec::new(),
        };
        h.set("workload", "seed");
        let ops = vec![
            TraceOp::Alloc {
                object: 5,
                bytes: 8192,
            },
            TraceOp::RoundEnd { phase: 1 },
            TraceOp::Free { object: 5 },
        ];
        let mut w = CsvWriter::new(Vec::new(), &h).unwrap();
        for &op in &ops {
            w.write(op).unwrap();
        }
        assert_eq!(w.ops(), 3);
        let text = String::from_utf8(w.finish().unwrap()).unwrap();
        assert!(text.contains("\nop,object,bytes\nalloc,5,8192\nround,,1\nfree,5,\n"));
        let (h2, ops2) = read(&text).unwrap();
        assert_eq!((h2, ops2), (h, ops));
    }
}

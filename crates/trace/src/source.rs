//! [`TraceSource`] and [`TraceSink`]: a trace of either format, chosen by
//! content when reading and by name (or choice) when writing.

use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufReader, BufWriter, Cursor, Read, Write};
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::csv::{CsvReader, CsvWriter};
use crate::error::{Position, TraceError};
use crate::format::{Totals, TraceReader, TraceWriter, MAGIC};
use crate::op::{TraceHeader, TraceOp};

/// The two trace formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceFormat {
    /// The compact binary format ([`TraceReader`](crate::TraceReader), [`TraceWriter`](crate::TraceWriter)).
    Binary,
    /// `op,object,bytes` text ([`CsvReader`](crate::CsvReader), [`CsvWriter`](crate::CsvWriter)).
    Csv,
}

impl TraceFormat {
    /// `binary` or `csv`.
    pub const fn name(self) -> &'static str {
        match self {
            TraceFormat::Binary => "binary",
            TraceFormat::Csv => "csv",
        }
    }

    /// The format a file name asks for: `.csv` (any case) is CSV, anything
    /// else binary.
    pub fn for_path(path: &Path) -> TraceFormat {
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("csv") => TraceFormat::Csv,
            _ => TraceFormat::Binary,
        }
    }
}

impl fmt::Display for TraceFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// An unknown format name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown trace format {0:?} (known: binary, csv)")]
pub struct UnknownFormat(pub String);

blockalloc::invalid_input_errors!(UnknownFormat);

impl FromStr for TraceFormat {
    type Err = UnknownFormat;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "binary" | "bin" => Ok(TraceFormat::Binary),
            "csv" => Ok(TraceFormat::Csv),
            _ => Err(UnknownFormat(s.to_string())),
        }
    }
}

type Input = Box<dyn BufRead + Send>;

enum Reader {
    Binary(TraceReader<Input>),
    Csv(CsvReader<Input>),
}

/// A trace being read, in either format: the format is recognised by the
/// binary magic, anything else is read as CSV.
///
/// ```
/// use blockalloc_trace::{TraceFormat, TraceOp, TraceSource};
///
/// let src = TraceSource::from_reader(&b"alloc,1,4096\nfree,1\n"[..])?;
/// assert_eq!(src.format(), TraceFormat::Csv);
/// let ops: Vec<TraceOp> = src.collect::<Result<_, _>>()?;
/// assert_eq!(ops[1], TraceOp::Free { object: 1 });
/// # Ok::<(), blockalloc_trace::TraceError>(())
/// ```
pub struct TraceSource {
    reader: Reader,
    path: Option<PathBuf>,
    ops: u64,
}

impl fmt::Debug for TraceSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceSource")
            .field("format", &self.format())
            .field("path", &self.path)
            .field("ops", &self.ops)
            .finish()
    }
}

impl TraceSource {
    /// Opens a trace file; `-` reads standard input.
    ///
    /// # Errors
    /// [`TraceError::Io`] naming the path, or a header error.
    pub fn open(path: &Path) -> Result<Self, TraceError> {
        let input: Box<dyn Read + Send> = if path == Path::new("-") {
            Box::new(io::stdin())
        } else {
            Box::new(File::open(path).map_err(|e| TraceError::io(Some(path.into()), e))?)
        };
        let mut s = Self::from_reader(BufReader::with_capacity(1 << 16, input))
            .map_err(|e| with_path(e, path))?;
        s.path = Some(path.to_path_buf());
        Ok(s)
    }

    /// Reads a trace from any byte stream.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn from_reader(mut input: impl BufRead + Send + 'static) -> Result<Self, TraceError> {
        let mut head = Vec::with_capacity(MAGIC.len());
        (&mut input)
            .take(MAGIC.len() as u64)
            .read_to_end(&mut head)
            .map_err(|e| TraceError::io(None, e))?;
        let binary = head == MAGIC;
        let input: Input = Box::new(Cursor::new(head).chain(input));
        let reader = if binary {
            Reader::Binary(TraceReader::new(input)?)
        } else {
            Reader::Csv(CsvReader::new(input)?)
        };
        Ok(TraceSource {
            reader,
            path: None,
            ops: 0,
        })
    }

    /// The format recognised.
    pub fn format(&self) -> TraceFormat {
        match self.reader {
            Reader::Binary(_) => TraceFormat::Binary,
            Reader::Csv(_) => TraceFormat::Csv,
        }
    }

    /// The trace's header (for CSV: its metadata comments).
    pub fn header(&self) -> &TraceHeader {
        match &self.reader {
            Reader::Binary(r) => r.header(),
            Reader::Csv(r) => r.header(),
        }
    }

    /// The file, if opened from one.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Operations read so far.
    pub fn ops_read(&self) -> u64 {
        self.ops
    }

    /// Where the last operation read came from.
    pub fn location(&self) -> Position {
        match &self.reader {
            Reader::Binary(r) => Position::Offset(r.offset()),
            Reader::Csv(r) => Position::Line(r.line()),
        }
    }
}

fn with_path(e: TraceError, path: &Path) -> TraceError {
    match e {
        TraceError::Io { path: None, source } => TraceError::Io {
            path: Some(path.to_path_buf()),
            source,
        },
        e => e,
    }
}

impl Iterator for TraceSource {
    type Item = Result<TraceOp, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        let item = match &mut self.reader {
            Reader::Binary(r) => r.next(),
            Reader::Csv(r) => r.next(),
        };
        match item {
            Some(Ok(op)) => {
                self.ops += 1;
                Some(Ok(op))
            }
            Some(Err(e)) => Some(Err(match &self.path {
                Some(p) => with_path(e, p),
                None => e,
            })),
            None => None,
        }
    }
}

/// Operations decoded ahead of the work done on them, with where each was
/// read: the passes that validate a whole trace ([`crate::convert`],
/// [`crate::TraceSummary::scan`]) alternate decoding a batch and updating
/// the validator's map over it. That map misses the cache on every access
/// once millions of objects are live, and a tight loop of map updates keeps
/// several misses in flight (2-3x less CPU than one operation decoded,
/// checked and used at a time). Reading alike also makes a trace that is
/// both damaged and invalid fail with the same error in both.
pub(crate) struct Batch {
    ops: Vec<TraceOp>,
    at: Vec<Position>,
}

impl Batch {
    /// Operations per batch.
    const LEN: usize = 4096;

    pub(crate) fn new() -> Self {
        Batch {
            ops: Vec::with_capacity(Self::LEN),
            at: Vec::with_capacity(Self::LEN),
        }
    }

    /// Replaces the batch with the next operations of `source`; false when
    /// there are none left.
    ///
    /// # Errors
    /// The first read error, at once (the operations read before it in this
    /// batch are not looked at).
    pub(crate) fn refill(&mut self, source: &mut TraceSource) -> Result<bool, TraceError> {
        self.ops.clear();
        self.at.clear();
        while self.ops.len() < Self::LEN {
            match source.next() {
                Some(op) => {
                    self.ops.push(op?);
                    self.at.push(source.location());
                }
                None => break,
            }
        }
        Ok(!self.ops.is_empty())
    }

    /// The operations of the batch, in order.
    pub(crate) fn ops(&self) -> &[TraceOp] {
        &self.ops
    }

    /// The operations of the batch with where each was read.
    pub(crate) fn located(&self) -> impl Iterator<Item = (TraceOp, Position)> + '_ {
        self.ops.iter().copied().zip(self.at.iter().copied())
    }
}

type Output = BufWriter<Box<dyn Write + Send>>;

enum Writer {
    Binary(TraceWriter<Output>),
    Csv(CsvWriter<Output>),
}

/// A trace being written, in either format.
pub struct TraceSink {
    writer: Writer,
    path: Option<PathBuf>,
    totals: Totals,
}

impl fmt::Debug for TraceSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TraceSink")
            .field("format", &self.format())
            .field("path", &self.path)
            .field("totals", &self.totals)
            .finish()
    }
}

impl TraceSink {
    /// Creates (or truncates) `path` — `-` is standard output — and writes
    /// the header. `format: None` picks by the file name
    /// ([`TraceFormat::for_path`]).
    ///
    /// # Errors
    /// [`TraceError::Io`] naming the path, [`TraceError::BadHeader`].
    pub fn create(
        path: &Path,
        format: Option<TraceFormat>,
        header: &TraceHeader,
    ) -> Result<Self, TraceError> {
        let format = format.unwrap_or_else(|| TraceFormat::for_path(path));
        let out: Box<dyn Write + Send> = if path == Path::new("-") {
            Box::new(io::stdout())
        } else {
            Box::new(File::create(path).map_err(|e| TraceError::io(Some(path.into()), e))?)
        };
        let mut s = Self::to_writer(out, format, header).map_err(|e| with_path(e, path))?;
        s.path = Some(path.to_path_buf());
        Ok(s)
    }

    /// Writes a trace to any byte stream.
    ///
    /// # Errors
    /// As [`create`](Self::create).
    pub fn to_writer(
        out: Box<dyn Write + Send>,
        format: TraceFormat,
        header: &TraceHeader,
    ) -> Result<Self, TraceError> {
        let out = BufWriter::with_capacity(1 << 16, out);
        let writer = match format {
            TraceFormat::Binary => Writer::Binary(TraceWriter::new(out, header)?),
            TraceFormat::Csv => Writer::Csv(CsvWriter::new(out, header)?),
        };
        Ok(TraceSink {
            writer,
            path: None,
            totals: Totals::default(),
        })
    }

    /// The format written.
    pub fn format(&self) -> TraceFormat {
        match self.writer {
            Writer::Binary(_) => TraceFormat::Binary,
            Writer::Csv(_) => TraceFormat::Csv,
        }
    }

    /// Appends one operation.
    ///
    /// # Errors
    /// [`TraceError::Io`], [`TraceError::Unencodable`].
    pub fn write(&mut self, op: TraceOp) -> Result<(), TraceError> {
        let r = match &mut self.writer {
            Writer::Binary(w) => w.write(op),
            Writer::Csv(w) => w.write(op),
        };
        match r {
            Ok(()) => {
                self.totals.ops += 1;
                match op {
                    TraceOp::Alloc { .. } => self.totals.allocs += 1,
                    TraceOp::Free { .. } => self.totals.frees += 1,
                    TraceOp::RoundEnd { .. } => self.totals.rounds += 1,
                }
                Ok(())
            }
            Err(e) => Err(self.named(e)),
        }
    }

    fn named(&self, e: TraceError) -> TraceError {
        match &self.path {
            Some(p) => with_path(e, p),
            None => e,
        }
    }

    /// Counts of what was written.
    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Ends the trace (binary: last chunk and end marker) and flushes.
    ///
    /// # Errors
    /// [`TraceError::Io`].
    pub fn finish(self) -> Result<Totals, TraceError> {
        let totals = self.totals;
        let path = self.path.clone();
        let r = match self.writer {
            Writer::Binary(w) => w.finish().and_then(flush),
            Writer::Csv(w) => w.finish().and_then(flush),
        };
        r.map_err(|e| match &path {
            Some(p) => with_path(e, p),
            None => e,
        })?;
        Ok(totals)
    }
}

fn flush(out: Output) -> Result<(), TraceError> {
    out.into_inner()
        .map_err(|e| TraceError::io(None, e.into_error()))?
        .flush()
        .map_err(|e| TraceError::io(None, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_by_name_and_content() {
        assert_eq!(TraceFormat::for_path(Path::new("a.CSV")), TraceFormat::Csv);
        assert_eq!(
            TraceFormat::for_path(Path::new("a.trace")),
            TraceFormat::Binary
        );
        assert_eq!("CSV".parse::<TraceFormat>().unwrap(), TraceFormat::Csv);
        assert!("xml".parse::<TraceFormat>().is_err());

        let dir = tempfile::tempdir().unwrap();
        for format in [TraceFormat::Binary, TraceFormat::Csv] {
            let path = dir.path().join(format!("t.{}", format.name()));
            let header = TraceHeader {
                block_size: Some(4096),
                ..TraceHeader::default()
            };
            let mut sink = TraceSink::create(&path, Some(format), &header).unwrap();
            sink.write(TraceOp::Alloc {
                object: 1,
                bytes: 3,
            })
            .unwrap();
            sink.write(TraceOp::RoundEnd { phase: 1 }).unwrap();
            assert_eq!(sink.finish().unwrap().ops, 2);
            let src = TraceSource::open(&path).unwrap();
            assert_eq!(src.format(), format);
            assert_eq!(src.header().block_size, Some(4096));
            assert_eq!(src.collect::<Result<Vec<_>, _>>().unwrap().len(), 2);
        }
        let e = TraceSource::open(&dir.path().join("missing")).unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
    }
}

//! The one error type of this crate.

use hypercodec_scalar::ScalarError;

/// Everything that can go wrong reading or writing a `.hwz` archive.
///
/// Variants name the offending item (tensor, stream index, role) so that a message alone tells
/// which part of a file is bad.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HwzError {
    /// An I/O error from the underlying file or writer.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    /// The file is shorter than a header plus a tail.
    #[error("file of {len} bytes is too short to be a .hwz archive (at least {min} bytes)")]
    TooShort {
        /// File length.
        len: u64,
        /// The smallest possible archive.
        min: u64,
    },
    /// The magic bytes at the head or the tail are wrong.
    #[error("not a .hwz archive: bad magic {found:02x?} at the {place} of the file")]
    BadMagic {
        /// The bytes found.
        found: [u8; 4],
        /// `head` or `tail`.
        place: &'static str,
    },
    /// The file is a legacy zip-based (Hyper Glyph) archive, which this reader does not import.
    #[error("this is a legacy zip-based .hwz archive (Hyper Glyph); open it with the legacy importer (hwz::legacy)")]
    LegacyArchive,
    /// A legacy zip-based (Hyper Glyph) archive is malformed or uses something this importer
    /// does not read.
    #[error("legacy archive: {message}")]
    Legacy {
        /// What is wrong.
        message: String,
    },
    /// A size in a legacy zip-based archive is above what the file's bytes can justify: a zip
    /// entry or stream that would expand past `legacy::MAX_LEGACY_EXPANSION` times its bytes
    /// in the file (deflate and zstd together), or a tensor with more values than the caps of
    /// `hwz::legacy` allow. Nothing of that size was allocated.
    #[error("legacy archive: {what} of `{item}` is {value}, above the limit of {max} that the file's bytes justify; the file is corrupt or hostile")]
    LegacyLimit {
        /// The zip entry, stream or tensor.
        item: String,
        /// What was measured (`decoded bytes`, `values`, `low-rank rank`, ...).
        what: &'static str,
        /// The value found.
        value: u64,
        /// The cap.
        max: u64,
    },
    /// The header sets flag bits this version does not know.
    #[error("unknown header flags {flags:#x}; the archive needs a newer reader")]
    UnknownFlags {
        /// The flags word.
        flags: u32,
    },
    /// Rate control found no lattice scale that meets the target: the side information, or
    /// the coarsest useful scale, already costs more.
    #[error("tensor `{tensor}`: no lattice scale reaches {target_bps} bits per value (side information and the coarsest useful scale need more); use a coarser target or another encoding")]
    RateUnreachable {
        /// Tensor name.
        tensor: String,
        /// The target, bits per value all-in.
        target_bps: f64,
    },
    /// A row range outside the tensor's rows.
    #[error("tensor `{tensor}`: rows {start}..{end} are not inside its {rows} rows")]
    RowRange {
        /// Tensor name.
        tensor: String,
        /// First row asked for.
        start: u64,
        /// End of the range (exclusive).
        end: u64,
        /// Rows of the tensor's matrix view.
        rows: u64,
    },
    /// A count or length is above one of the named caps.
    #[error("{what} is {value}, above the limit of {max}")]
    LimitExceeded {
        /// What was counted (`manifest length`, `tensors`, `rank`, ...).
        what: &'static str,
        /// The value found.
        value: u64,
        /// The cap.
        max: u64,
    },
    /// The manifest lies outside the file or overlaps the header or tail.
    #[error(
        "manifest at offset {offset} with length {len} does not fit a file of {file_len} bytes"
    )]
    ManifestOutOfBounds {
        /// Manifest offset from the tail.
        offset: u64,
        /// Manifest length from the tail.
        len: u64,
        /// File length.
        file_len: u64,
    },
    /// The manifest's crc32c does not match.
    #[error("manifest checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the file is corrupt")]
    ManifestChecksum {
        /// Checksum stored in the tail.
        stored: u32,
        /// Checksum of the bytes read.
        computed: u32,
    },
    /// The manifest is not valid JSON of the expected shape.
    #[error("manifest is malformed: {message}")]
    ManifestJson {
        /// The parser's message.
        message: String,
    },
    /// The manifest's format version is not one this reader knows.
    #[error("unsupported archive version {version}; this reader knows version {known}")]
    UnsupportedVersion {
        /// Version found.
        version: u64,
        /// Version supported.
        known: u32,
    },
    /// A stream's bytes lie outside the stream area.
    #[error("stream {stream} (offset {offset}, length {length}) lies outside the stream area ending at {end}")]
    StreamOutOfBounds {
        /// Stream index.
        stream: usize,
        /// Its offset.
        offset: u64,
        /// Its stored length.
        length: u64,
        /// End of the stream area (the manifest offset).
        end: u64,
    },
    /// A stream does not start on a 64-byte boundary.
    #[error("stream {stream} starts at offset {offset}, not on a 64-byte boundary")]
    StreamMisaligned {
        /// Stream index.
        stream: usize,
        /// Its offset.
        offset: u64,
    },
    /// Two streams share bytes.
    #[error("streams {first} and {second} overlap")]
    StreamsOverlap {
        /// One stream index.
        first: usize,
        /// The other.
        second: usize,
    },
    /// A stream is referenced by two tensors, or twice by one: every stream belongs to
    /// exactly one role of one tensor.
    #[error(
        "tensor `{tensor}` role `{role}` refers to stream {index}, which another role already uses"
    )]
    StreamShared {
        /// Tensor name (the second reference).
        tensor: String,
        /// Stream role (the second reference).
        role: String,
        /// The stream index.
        index: u64,
    },
    /// A stream's crc32c does not match its bytes.
    #[error("stream {stream} checksum mismatch (stored {stored:#010x}, computed {computed:#010x}): the file is corrupt")]
    StreamChecksum {
        /// Stream index.
        stream: usize,
        /// Checksum in the manifest.
        stored: u32,
        /// Checksum of the bytes read.
        computed: u32,
    },
    /// A compressed stream claims a decoded size that its stored size cannot justify, or an
    /// uncompressed one has `raw_length != length`.
    #[error("stream {stream} claims {raw_length} decoded bytes from {length} stored bytes ({compression})")]
    StreamExpansion {
        /// Stream index.
        stream: usize,
        /// Claimed decoded length.
        raw_length: u64,
        /// Stored length.
        length: u64,
        /// The compression named.
        compression: &'static str,
    },
    /// A zstd stream does not decode to its stated length.
    #[error("stream {stream} does not decompress: {message}")]
    Decompress {
        /// Stream index.
        stream: usize,
        /// What went wrong.
        message: String,
    },
    /// A tensor names a stream index that does not exist.
    #[error(
        "tensor `{tensor}` role `{role}` refers to stream {index}, but there are {count} streams"
    )]
    StreamRef {
        /// Tensor name.
        tensor: String,
        /// Stream role.
        role: String,
        /// The index named.
        index: u64,
        /// Number of streams.
        count: usize,
    },
    /// A stream role that the tensor's encoding needs is absent.
    #[error("tensor `{tensor}` lacks its `{role}` stream")]
    MissingStream {
        /// Tensor name.
        tensor: String,
        /// The missing role.
        role: String,
    },
    /// A stream role that the tensor's encoding does not use is present.
    #[error("tensor `{tensor}` has a `{role}` stream its encoding does not use")]
    UnexpectedStream {
        /// Tensor name.
        tensor: String,
        /// The extra role.
        role: String,
    },
    /// A stream's decoded length differs from what the shape and encoding require.
    #[error("tensor `{tensor}` stream `{role}` holds {actual} bytes; its shape and encoding need {expected}")]
    StreamSize {
        /// Tensor name.
        tensor: String,
        /// Stream role.
        role: String,
        /// Required length.
        expected: u64,
        /// Length in the archive.
        actual: u64,
    },
    /// The encoding's `type` tag is not one this build knows.
    #[error("tensor `{tensor}` uses encoding `{tag}`, which this build does not know; upgrade hypercodec")]
    UnknownEncoding {
        /// Tensor name.
        tensor: String,
        /// The tag found.
        tag: String,
    },
    /// The encoding's parameters are invalid (for example 12-bit affine).
    #[error("tensor `{tensor}` has an invalid encoding: {message}")]
    InvalidEncoding {
        /// Tensor name.
        tensor: String,
        /// What is wrong.
        message: String,
    },
    /// The element count of a shape overflows or exceeds `MAX_ELEMENTS`.
    #[error(
        "tensor `{tensor}` has shape {shape:?}, whose element count overflows the limit of {max}"
    )]
    ShapeOverflow {
        /// Tensor name.
        tensor: String,
        /// The shape.
        shape: Vec<u64>,
        /// The cap.
        max: u64,
    },
    /// The number of values given does not match the shape.
    #[error(
        "tensor `{tensor}` has shape {shape:?} ({expected} values) but {actual} values were given"
    )]
    ElementCount {
        /// Tensor name.
        tensor: String,
        /// The shape.
        shape: Vec<u64>,
        /// Elements the shape holds.
        expected: u64,
        /// Values given.
        actual: u64,
    },
    /// A tensor name is empty, too long, or used twice.
    #[error("invalid tensor name `{name}`: {reason}")]
    InvalidName {
        /// The name (possibly cut).
        name: String,
        /// Why.
        reason: &'static str,
    },
    /// No tensor of that name.
    #[error("no tensor named `{name}` in the archive")]
    TensorNotFound {
        /// The name asked for.
        name: String,
    },
    /// The lattice quantizer rejected the data or the parameters.
    #[error("tensor `{tensor}`: {source}")]
    Lattice {
        /// Tensor name.
        tensor: String,
        /// The quantizer's error.
        source: hypercodec_lattice::LatticeError,
    },
    /// The trellis coder rejected the data or the parameters.
    #[error("tensor `{tensor}`: {source}")]
    Trellis {
        /// Tensor name.
        tensor: String,
        /// The coder's error.
        source: hypercodec_trellis::TrellisError,
    },
    /// A symbol stream does not decode (corrupt, truncated or inconsistent).
    #[error("tensor `{tensor}`: {source}")]
    Coding {
        /// Tensor name.
        tensor: String,
        /// The coder's error.
        source: hypercodec_rice::CodingError,
    },
    /// The codebook / low-rank / sparse codec rejected the data.
    #[error("tensor `{tensor}`: {source}")]
    Codebook {
        /// Tensor name.
        tensor: String,
        /// The codec's error.
        source: hypercodec_hdc::HdcError,
    },
    /// A scalar codec rejected the data.
    #[error("tensor `{tensor}`: {source}")]
    Scalar {
        /// Tensor name.
        tensor: String,
        /// The codec's error.
        source: ScalarError,
    },
}

/// Result alias of this crate.
pub type Result<T, E = HwzError> = std::result::Result<T, E>;

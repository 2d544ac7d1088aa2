#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod codebook_codec;
mod codec;
mod encoding;
mod error;
mod lattice_codec;
mod layout;
pub mod legacy;
mod manifest;
mod nested_codec;
mod par;
mod read;
mod trellis_codec;
mod view;
mod write;
pub mod zstd_codec;

pub use codebook_codec::{codebook_template, encode as encode_codebook, CodebookSettings};
pub use codec::{decode_into, encode, encode_calibrated, encode_to_rate, Calibrated};
pub use encoding::{
    element_count, legacy_matrix_shape, matrix_view, prefix_gpu_chunk, role, Assignments, Coding,
    EncodeOptions, EncodedTensor, Encoding, LatticeScale, Residual, StreamLen, TrellisRowsEncoder,
    GPU_CHUNK_SYMBOLS, KNOWN_ENCODINGS, MAX_ELEMENTS, MAX_MODEL_LEN, MAX_RANK,
    MAX_SYMBOLS_PER_BYTE, MIN_SIZED_PROB_BITS, PREFIX_GPU_CHUNKS, PREFIX_GPU_MIN_CHUNK,
    PREFIX_GPU_SMALL,
};
pub use error::{HwzError, Result};
pub use hypercodec_hdc::residual::top_k as top_k_errors;
pub use hypercodec_hdc::{HdcParams, ResidualDtype, ScaleMode};
pub use hypercodec_lattice::{tile_for, Lattice};
pub use hypercodec_rice::CodingError;
pub use hypercodec_scalar::{AffineParams, FloatDtype, Group, ScalarError};
pub use layout::MAX_PARTS;
pub use manifest::{
    check_name, min_stored_bytes, parse_head, sniff, Compression, Manifest, Sniff, StreamEntry,
    Tail, TensorEntry, TensorStats, ALIGN, FORMAT_VERSION, HEADER_LEN, MAGIC, MATRIX_VIEW_VERSION,
    MAX_DTYPE_LEN, MAX_MANIFEST_LEN, MAX_MANIFEST_RATIO, MAX_NAME_LEN, MAX_STREAMS, MAX_TENSORS,
    MAX_VALUES_PER_STORED_BYTE, MAX_ZSTD_EXPANSION, TAIL_LEN, ZIP_MAGIC,
};
pub use nested_codec::{assemble_exceptions, assemble_mixed};
pub use read::{decode_stream, Archive, ReadAt};
pub use view::{
    AssignmentsRef, CodebookParts, LatticeParts, LowRankParts, OutBuf, Parts, Symbols, TensorView,
    TrellisParts,
};
#[cfg(feature = "std-fs")]
pub use write::{
    remove_unfinished, temp_file_in, FileWriter, Unfinished, MANIFEST_COMPRESS_MIN, PLAN_INLINE_MAX,
};
pub use write::{Writer, WriterOptions};

#[cfg(test)]
mod tests;

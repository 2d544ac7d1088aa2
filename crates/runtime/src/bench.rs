//! The runtime benchmark: filled below.

//! Checks on an output path before anything is written: never over an input, never over
//! something that is not a regular file.

use crate::error::{PipelineError, Result};
use std::path::Path;

/// What kind of thing `meta` describes, for a message.
fn kind(meta: &std::fs::Metadata) -> &'static str {
    let t = meta.file_type();
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_fifo() {
            return "a FIFO";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    if t.is_dir() {
        "a folder"
    } else {
        "not a regular file"
    }
}

/// True when both metadata describe one file (same device and inode on unix).
fn same_file(a: &Path, am: &std::fs::Metadata, b: &Path, bm: &std::fs::Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let _ = (a, b);
        am.dev() == bm.dev() && am.ino() == bm.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (am, bm);
        matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
    }
}

/// Refuses an `output` that is one of `inputs` (the same file under any name: the rename at
/// the end would destroy the input) or that exists and is not a regular file (a character
/// device, a FIFO, a folder: the rename would replace it with a regular file). A missing
/// output is fine.
pub fn check_output<'a>(output: &Path, inputs: impl IntoIterator<Item = &'a Path>) -> Result<()> {
    let Ok(out_meta) = std::fs::metadata(output) else {
        return Ok(());
    };
    if !out_meta.is_file() {
        return Err(PipelineError::OutputNotAFile {
            path: output.into(),
            kind: kind(&out_meta),
        });
    }
    for input in inputs {
        if let Ok(in_meta) = std::fs::metadata(input) {
            if same_file(output, &out_meta, input, &in_meta) {
                return Err(PipelineError::OutputIsInput {
                    path: output.into(),
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_and_non_files_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.bin");
        std::fs::write(&a, b"x").expect("write");
        let other = dir.path().join("b.bin");
        assert!(check_output(&other, [a.as_path()]).is_ok());
        std::fs::write(&other, b"y").expect("write");
        assert!(check_output(&other, [a.as_path()]).is_ok());
        let same = dir.path().join(".").join("a.bin");
        assert!(matches!(
            check_output(&same, [a.as_path()]),
            Err(PipelineError::OutputIsInput { .. })
        ));
        assert!(matches!(
            check_output(dir.path(), []),
            Err(PipelineError::OutputNotAFile { .. })
        ));
        #[cfg(unix)]
        assert!(matches!(
            check_output(Path::new("/dev/null"), []),
            Err(PipelineError::OutputNotAFile { .. })
        ));
    }
}

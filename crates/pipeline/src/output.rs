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

/// Opens the input `path` for reading, once it is known to be a regular file: opening a FIFO
/// blocks until something writes to it (`compress FIFO out.hwz` hung for ever), and a device
/// or a folder is no input. The check reads metadata only, which never blocks.
pub fn open_input(path: &Path) -> Result<std::fs::File> {
    check_input(path)?;
    std::fs::File::open(path).map_err(PipelineError::io(path))
}

/// [`open_input`]'s check alone, for a reader that opens the file itself.
pub fn check_input(path: &Path) -> Result<()> {
    let meta = std::fs::metadata(path).map_err(PipelineError::io(path))?;
    if !meta.is_file() {
        return Err(PipelineError::InputNotAFile {
            path: path.into(),
            kind: kind(&meta),
        });
    }
    Ok(())
}

/// The most bytes of a JSON input read whole (a plan, sensitivity weights, a shard index):
/// the archive reader's cap on a manifest, 64 MiB.
pub const MAX_JSON_INPUT: u64 = 64 << 20;

/// The JSON input `path` (a `what`) read whole, refused above [`MAX_JSON_INPUT`] before it
/// is read (`--plan` of a sparse 3 GB file took 3 GB of memory to say "not a plan").
pub fn read_json_input(path: &Path, what: &'static str) -> Result<String> {
    let file = open_input(path)?;
    let bytes = file.metadata().map_err(PipelineError::io(path))?.len();
    if bytes > MAX_JSON_INPUT {
        return Err(PipelineError::InputTooLarge {
            path: path.into(),
            what,
            bytes,
            max: MAX_JSON_INPUT,
        });
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, MAX_JSON_INPUT), &mut text)
        .map_err(PipelineError::io(path))?;
    Ok(text)
}

/// Writes `text` to `path` as the archives are written: into a temporary file beside it, then
/// renamed over it, so that a failure leaves no half-written file under the final name; an
/// output that is one of `inputs`, or not a regular file, is refused first.
pub fn write_text<'a>(
    path: &Path,
    text: &str,
    inputs: impl IntoIterator<Item = &'a Path>,
) -> Result<()> {
    check_output(path, inputs)?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let mut tmp =
        hypercodec_hwz::temp_file_in(dir, ".hwz-text-").map_err(PipelineError::io(dir))?;
    std::io::Write::write_all(&mut tmp, text.as_bytes()).map_err(PipelineError::io(path))?;
    tmp.persist(path)
        .map_err(|e| PipelineError::io(path)(e.error))?;
    Ok(())
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

//! `remove_unfinished` (what a second Ctrl-C calls before exiting): alone in its own test
//! binary, since it removes the temporary files of every writer of the process.

#![cfg(feature = "std-fs")]

use hypercodec_hwz::{remove_unfinished, FileWriter, WriterOptions};

#[test]
fn remove_unfinished_deletes_writers_temporaries_and_nothing_finished() {
    let dir = tempfile::tempdir().expect("tempdir");
    let done =
        FileWriter::create(dir.path().join("done.hwz"), WriterOptions::default()).expect("create");
    done.finish().expect("finish");
    let open =
        FileWriter::create(dir.path().join("open.hwz"), WriterOptions::default()).expect("create");
    let names = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir.path())
            .expect("dir")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let before = names();
    assert_eq!(before.len(), 2, "{before:?}");
    assert!(before
        .iter()
        .any(|n| n.starts_with(".hwz-") && n.ends_with(".tmp")));
    remove_unfinished();
    assert_eq!(names(), vec!["done.hwz".to_string()]);
    drop(open);
}

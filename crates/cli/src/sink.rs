//! Where the commands' text goes: the process's stdout and stderr, or, for a caller that
//! embeds the command line ([`run_args_captured`](crate::run_args_captured), the Python
//! wheel), two buffers it reads back and writes through its own streams.
//!
//! The capture is per thread: a command prints from the thread that runs it, and two threads
//! of one process (two Python threads, each compressing a model) never see each other's text.

use std::cell::RefCell;
use std::fmt;
use std::io::{self, Write as _};

/// The text a captured run printed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Captured {
    /// What the command line prints on stdout: summaries, tables, JSON.
    pub stdout: String,
    /// What it prints on stderr: warnings (a skipped non-float tensor), notes.
    pub stderr: String,
}

thread_local! {
    static CAPTURE: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

/// Runs `f` with this thread's text going to a fresh [`Captured`], returned beside `f`'s
/// result; a capture already under way (a nested call) is restored afterwards.
pub(crate) fn capture<T>(f: impl FnOnce() -> T) -> (T, Captured) {
    /// The outer capture, put back however `f` ends: a panic that unwinds through it (which
    /// pyo3 turns into an exception) must not leave this thread's later text in a stale buffer.
    struct Restore(Option<Captured>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let outer = self.0.take();
            CAPTURE.with_borrow_mut(|c| *c = outer);
        }
    }
    let restore = Restore(CAPTURE.with_borrow_mut(|c| c.replace(Captured::default())));
    let value = f();
    let captured = CAPTURE.with_borrow_mut(Option::take).unwrap_or_default();
    drop(restore);
    (value, captured)
}

/// Writes to the captured stdout, else to the process's (locked, so that a closed pipe is an
/// error the caller sees instead of a panic).
pub(crate) fn write_out(args: fmt::Arguments<'_>) -> io::Result<()> {
    let captured = CAPTURE.with_borrow_mut(|c| match c {
        Some(c) => {
            // Formatting into a String cannot fail.
            let _ = fmt::Write::write_fmt(&mut c.stdout, args);
            true
        }
        None => false,
    });
    if captured {
        Ok(())
    } else {
        io::stdout().lock().write_fmt(args)
    }
}

/// Writes a line to the captured stderr, else to the process's (as `eprintln!`, whose
/// failures nobody can report).
pub(crate) fn err_line(args: fmt::Arguments<'_>) {
    let captured = CAPTURE.with_borrow_mut(|c| match c {
        Some(c) => {
            let _ = fmt::Write::write_fmt(&mut c.stderr, args);
            c.stderr.push('\n');
            true
        }
        None => false,
    });
    if !captured {
        let _ = writeln!(io::stderr().lock(), "{args}");
    }
}

/// `println!` through [`write_out`]: a write error (a closed pipe: the reader, e.g. `head`, went
/// away) returns from the enclosing function instead of panicking; `main` ends quietly on a
/// broken pipe.
macro_rules! outln {
    ($($arg:tt)*) => {
        crate::sink::write_out(format_args!("{}\n", format_args!($($arg)*))).map_err(crate::stdout_error)?
    };
}
pub(crate) use outln;

/// `print!` as [`outln!`].
macro_rules! out {
    ($($arg:tt)*) => {
        crate::sink::write_out(format_args!($($arg)*)).map_err(crate::stdout_error)?
    };
}
pub(crate) use out;

/// `eprintln!` through [`err_line`].
macro_rules! errln {
    ($($arg:tt)*) => {
        crate::sink::err_line(format_args!($($arg)*))
    };
}
pub(crate) use errln;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_capture_takes_the_text_and_restores_the_outer_one() {
        let ((), outer) = capture(|| {
            write_out(format_args!("a")).unwrap();
            let ((), inner) = capture(|| {
                write_out(format_args!("b")).unwrap();
                err_line(format_args!("warn {}", 1));
            });
            assert_eq!(inner.stdout, "b");
            assert_eq!(inner.stderr, "warn 1\n");
            write_out(format_args!("c")).unwrap();
        });
        assert_eq!(outer.stdout, "ac");
        assert_eq!(outer.stderr, "");
    }

    #[test]
    fn a_panic_inside_a_capture_restores_the_outer_state() {
        let caught = std::panic::catch_unwind(|| {
            capture(|| {
                write_out(format_args!("lost")).unwrap();
                panic!("inside");
            })
        });
        assert!(caught.is_err());
        CAPTURE.with_borrow(|c| assert!(c.is_none()));
    }

    #[test]
    fn another_thread_prints_outside_the_capture() {
        let ((), c) = capture(|| {
            std::thread::spawn(|| CAPTURE.with_borrow(|c| assert!(c.is_none())))
                .join()
                .unwrap();
        });
        assert_eq!(c, Captured::default());
    }
}

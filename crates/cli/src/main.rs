//! The `hypercodec` binary: the command line of [`hypercodec::main_with_args`] over this
//! process's arguments, with Ctrl-C, SIGTERM and SIGHUP cancelling the running step.

fn main() -> std::process::ExitCode {
    hypercodec::install_signal_handler();
    std::process::ExitCode::from(hypercodec::main_with_args(std::env::args_os()))
}

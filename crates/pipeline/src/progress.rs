//! Progress reports and cancellation, shared by every long-running call.

use crate::error::{PipelineError, Result};
use std::sync::atomic::{AtomicBool, Ordering};

/// What a long call is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// BUDGET's first pass: measuring every candidate on every tensor.
    Measure,
    /// Encoding and writing tensors.
    Compress,
    /// Measuring and choosing (`plan`).
    Plan,
    /// Decoding an archive.
    Decompress,
    /// Measuring representations.
    Benchmark,
}

impl Phase {
    /// A short lowercase name, for progress bars.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Measure => "measure",
            Phase::Compress => "compress",
            Phase::Plan => "plan",
            Phase::Decompress => "decompress",
            Phase::Benchmark => "benchmark",
        }
    }
}

/// One step of progress: `elements` more values of `tensor` are done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress<'a> {
    /// The phase.
    pub phase: Phase,
    /// The tensor just done.
    pub tensor: &'a str,
    /// Values done in this step.
    pub elements: u64,
    /// Values done in this phase so far.
    pub done: u64,
    /// Values of the whole phase.
    pub total: u64,
}

/// A cancel flag: set it (from another thread, a signal handler) and the call returns
/// [`PipelineError::Cancelled`] before its next tensor.
#[derive(Debug, Default)]
pub struct Cancel(AtomicBool);

impl Cancel {
    /// A flag that is not set.
    pub const fn new() -> Self {
        Cancel(AtomicBool::new(false))
    }

    /// Sets the flag.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the flag is set.
    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// `Err(Cancelled)` when the flag is set.
    pub fn check(&self) -> Result<()> {
        if self.is_cancelled() {
            Err(PipelineError::Cancelled)
        } else {
            Ok(())
        }
    }
}

/// Counts one phase's progress and reports each step.
pub(crate) struct Tracker<'a, 'f> {
    phase: Phase,
    done: u64,
    total: u64,
    report: &'a mut (dyn FnMut(Progress<'_>) + 'f),
}

impl<'a, 'f> Tracker<'a, 'f> {
    pub(crate) fn new(
        phase: Phase,
        total: u64,
        report: &'a mut (dyn FnMut(Progress<'_>) + 'f),
    ) -> Self {
        Tracker {
            phase,
            done: 0,
            total,
            report,
        }
    }

    pub(crate) fn step(&mut self, tensor: &str, elements: u64) {
        self.done += elements;
        (self.report)(Progress {
            phase: self.phase,
            tensor,
            elements,
            done: self.done,
            total: self.total,
        });
    }
}

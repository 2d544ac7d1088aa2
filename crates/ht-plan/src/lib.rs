//! hypercodec-plan: measures the stored bytes and the error of every candidate encoding of a
//! tensor (or of each block of it) and chooses one by a planner mode (LOWEST, HIGHEST, ALLOW,
//! CLOSEST, AVERAGE, BEST, PER_WEIGHT, PER_BLOCK) or by a global bit budget.
//!
//! Key design decision: every choice is made from *measured* reconstruction error and stored
//! bytes, never from a rule of thumb, and the Plan records every candidate tried and why the
//! winner won.
//!
//! Status: filled by the precision planner issue.
#![deny(missing_docs)]

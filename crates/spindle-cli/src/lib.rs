//! The `spindle` command line as a library: its commands, the options they
//! share and how a model is found (pulled on first use). The binary
//! (`main.rs`) parses arguments and calls these; the Python package
//! (`crates/spindle-py`) starts the server's engine through
//! [`commands::serve::prepare`] with the same flags, defaults and checks.

pub mod commands;
pub mod grammar;
pub mod home;
pub mod options;
pub mod progress;
pub mod speculation;

//! Standard output and error for every command. A closed pipe (`glia runs
//! list | head -1`) is not an error: the first write that finds it ends the
//! process quietly with status 0 ([`closed_or_fail`]), here and for the
//! errors that reach `main` ([`broken_pipe`]). Nothing else in the CLI
//! writes to stdout or stderr with `println!`/`eprintln!` (which panic on a
//! closed pipe): use [`outln!`], [`out!`] and [`errln!`].

use std::fmt;
use std::io::{self, Write};

/// Write `args` and a newline to stdout.
pub fn line(args: fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    if let Err(e) = writeln!(out, "{args}") {
        closed_or_fail(e);
    }
}

/// Write `args` to stdout (no newline).
pub fn text(args: fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    if let Err(e) = write!(out, "{args}").and_then(|()| out.flush()) {
        closed_or_fail(e);
    }
}

/// Write `args` and a newline to stderr; a closed stderr is ignored (there
/// is nobody left to tell).
pub fn err_line(args: fmt::Arguments<'_>) {
    let _ = writeln!(io::stderr().lock(), "{args}");
}

/// A write to stdout failed: a closed pipe ends the process with status 0;
/// anything else (a full disk) with status 1, saying so on stderr.
pub fn closed_or_fail(e: io::Error) -> ! {
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    err_line(format_args!("glia: writing to standard output: {e}"));
    std::process::exit(1);
}

/// Whether `e` (or one of its causes) is a write to a closed pipe.
pub fn broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>()
            .is_some_and(|io| io.kind() == io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_is_found_in_an_error_chain() {
        let e = anyhow::Error::new(io::Error::from(io::ErrorKind::BrokenPipe))
            .context("writing the export");
        assert!(broken_pipe(&e));
        assert!(!broken_pipe(&anyhow::anyhow!("refused")));
    }
}

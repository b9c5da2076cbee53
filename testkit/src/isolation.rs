//! Private databases, prefixes, directories and service instances.

pub use glia_backends::testkit::*;

//! Fuzzes what durun does with one line from an agent: classify it, decode
//! the request, and print the canonical args its key hashes.
//!
//!     cargo install cargo-fuzz && cargo +nightly fuzz run parse_line
#![no_main]

libfuzzer_sys::fuzz_target!(|line: &[u8]| {
    durun::fuzzing::request_line(line);
});

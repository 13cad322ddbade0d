//! The S3 gateway as a client without keys meets it: any bytes on a connection (HTTP/1
//! request lines and headers, chunked bodies, SigV4 `Authorization` headers and
//! presigned queries, S3 XML bodies) get an answer or a closed connection, never a
//! panic or a hang. The gateway is the real one, in this process, with a master that is
//! not there (what would reach it fails as unavailable).
#![no_main]
use libfuzzer_sys::fuzz_target;

#[path = "common/gateway.rs"]
mod common;
use common::exchange;

fuzz_target!(|data: &[u8]| {
    exchange(data);
});

//! The `?search=` language: any text parses or is refused, and what parses evaluates
//! against an object without a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use locus_search::query::{Expr, LocusAttrs, Object};

struct O(LocusAttrs);

impl Object for O {
    fn key(&self) -> &str {
        "logs/2024/app.log"
    }
    fn size(&self) -> u64 {
        12345
    }
    fn mtime_ms(&self) -> i64 {
        1_700_000_000_000
    }
    fn content_type(&self) -> &str {
        "text/plain"
    }
    fn etag(&self) -> &str {
        "0123456789abcdef0123456789abcdef"
    }
    fn meta(&self, name: &str) -> Option<&str> {
        (name == "food").then_some("ice-cream")
    }
    fn tag(&self, name: &str) -> Option<&str> {
        (name == "team").then_some("data")
    }
    fn locus(&self) -> Option<&LocusAttrs> {
        Some(&self.0)
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    if let Ok(e) = Expr::parse(s) {
        let _ = e.matches(&O(LocusAttrs { cached: 0.5, tier: "MEM".into(), pinned: true, ..Default::default() }));
    }
    let _ = locus_search::query::parse_time(s);
});

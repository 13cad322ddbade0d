//! S3 Select's dialect: any expression translates or gets an S3 Select error, never a
//! panic, with the columns of a CSV header, of a CSV without one, or of JSON.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else { return };
    let cols = ["name".to_string(), "Age".to_string(), "_3".to_string()];
    for c in [None, Some((&cols[..], true)), Some((&cols[..], false))] {
        let _ = locus_select::translate(s, c);
    }
    let _ = locus_select::normalize_from(s);
    let _ = locus_select::ion_timestamp(s);
});

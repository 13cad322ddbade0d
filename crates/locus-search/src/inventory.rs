//! Inventory records into catalog entries (`locus fs index import`): the client sends
//! an inventory file's records as the file holds them ([`pb::InventoryChunk`]: S3
//! Inventory's CSV, or JSON lines that may also carry `metadata` and `tags` maps), and
//! the master parses them here. The import's floor (`locus bench index-floor`) parses
//! with the same code. A Parquet inventory is read by the client (it needs the SQL
//! build) and arrives as encoded entries.

use std::borrow::Cow;
use std::collections::BTreeMap;

use locus_common::path::normalize;
use locus_common::{Error, Result};
use locus_proto::pb;
use pb::import_catalog_request::Objects;

/// The entries an import request carries, with their paths checked and normalized.
/// Blocking (it parses a whole batch).
pub fn entries(objects: Option<Objects>) -> Result<Vec<(String, pb::CatalogEntry)>> {
    let mut out = Vec::new();
    match objects {
        None => {}
        Some(Objects::Batch(b)) => {
            use prost::Message;
            let batch = pb::CatalogImportBatch::decode(b)
                .map_err(|e| Error::invalid(format!("an import batch that does not decode: {e}")))?;
            out.reserve(batch.entries.len());
            for i in batch.entries {
                out.push((checked(&i.path)?, i.entry.unwrap_or_default()));
            }
        }
        Some(Objects::Chunk(c)) => parse(&c, &mut |p, e| {
            out.push((checked(&p)?, e));
            Ok(())
        })?,
    }
    Ok(out)
}

/// An imported object's path, normalized; an object needs a path below `/`.
fn checked(path: &str) -> Result<String> {
    let p = normalize(path)?;
    if p == "/" {
        return Err(Error::invalid("an imported object needs a path below /"));
    }
    Ok(p)
}

/// Where an object goes: `under/key`, or `/bucket/key`; `None` for a folder marker.
pub fn path_for(under: Option<&str>, bucket: &str, key: &str) -> std::result::Result<Option<String>, &'static str> {
    if key.is_empty() || key.ends_with('/') {
        return Ok(None); // a folder marker, not an object
    }
    Ok(Some(match under {
        Some(u) => format!("{}/{key}", u.trim_end_matches('/')),
        None if !bucket.is_empty() => format!("/{bucket}/{key}"),
        None => return Err("no bucket for this object: give --under PATH"),
    }))
}

/// A column name as [`pb::InventoryChunk::columns`] holds it.
pub fn norm_col(s: &str) -> String {
    s.trim().chars().filter(|c| c.is_ascii_alphanumeric()).collect::<String>().to_ascii_lowercase()
}

fn parse_time(s: &str) -> Option<i64> {
    let s = s.trim();
    if let Ok(ms) = s.parse::<i64>() {
        return Some(ms);
    }
    humantime::parse_rfc3339_weak(s.trim_end_matches('Z'))
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
}

/// Where in the inventory a record is, for its errors.
struct At<'a> {
    source: &'a str,
    line: u64,
}

impl At<'_> {
    fn bad(&self, msg: impl std::fmt::Display) -> Error {
        Error::invalid(format!("{}:{}: {msg}", self.source, self.line))
    }

    /// An inventory's size field (empty: 0).
    fn size(&self, size: &str) -> Result<u64> {
        if size.is_empty() {
            return Ok(0);
        }
        size.parse().map_err(|_| self.bad(format!("size {size:?} is not a number")))
    }

    /// An inventory's last-modified field (empty: 0).
    fn mtime(&self, t: &str) -> Result<i64> {
        if t.is_empty() {
            return Ok(0);
        }
        parse_time(t).ok_or_else(|| self.bad(format!("last modified {t:?} is not a time")))
    }

    fn path(&self, under: Option<&str>, bucket: &str, key: &str) -> Result<Option<String>> {
        path_for(under, bucket, key).map_err(|e| self.bad(e))
    }
}

/// Parse `c`'s records, calling `emit` with each object's path (not yet normalized) and
/// entry.
fn parse(c: &pb::InventoryChunk, emit: &mut dyn FnMut(String, pb::CatalogEntry) -> Result<()>) -> Result<()> {
    let under = (!c.under.is_empty()).then_some(c.under.as_str());
    if let Some(u) = under {
        normalize(u)?;
    }
    match c.format() {
        pb::InventoryFormat::InventoryJsonLines => json_lines(c, under, emit),
        pb::InventoryFormat::InventoryCsv => csv_records(c, under, emit),
        pb::InventoryFormat::Unspecified => Err(Error::invalid("an inventory chunk needs a format")),
    }
}

fn json_lines(
    c: &pb::InventoryChunk,
    under: Option<&str>,
    emit: &mut dyn FnMut(String, pb::CatalogEntry) -> Result<()>,
) -> Result<()> {
    for (i, l) in c.data.split(|&b| b == b'\n').enumerate() {
        if l.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let at = At { source: &c.source, line: c.first_line + i as u64 };
        let o: JsonObject = serde_json::from_slice(l).map_err(|e| at.bad(format!("not an inventory line: {e}")))?;
        let key = Text::text(&o.key).ok_or_else(|| at.bad("no key"))?;
        let Some(p) = at.path(under, &Text::text(&o.bucket).unwrap_or_default(), &key)? else { continue };
        let entry = pb::CatalogEntry {
            size: at.size(&Text::text(&o.size).unwrap_or_default())?,
            mtime_ms: at.mtime(&Text::text(&o.last_modified).unwrap_or_default())?,
            etag: Text::text(&o.etag).unwrap_or_default().trim_matches('"').to_string(),
            content_type: Text::text(&o.content_type).unwrap_or_default().into_owned(),
            user: Text::map(o.metadata)
                .map(|(k, v)| {
                    // S3's names are case-insensitive, stored lower case without the prefix.
                    let mut k = k.to_ascii_lowercase();
                    if k.starts_with("x-amz-meta-") {
                        k.drain(.."x-amz-meta-".len());
                    }
                    (k, v)
                })
                .collect(),
            tags: Text::map(o.tags).collect(),
            inode: 0,
        };
        emit(p, entry)?;
    }
    Ok(())
}

fn csv_records(
    c: &pb::InventoryChunk,
    under: Option<&str>,
    emit: &mut dyn FnMut(String, pb::CatalogEntry) -> Result<()>,
) -> Result<()> {
    let col = |name: &str| c.columns.iter().position(|c| c == name);
    let (key, bucket, size, mtime, etag, ctype) =
        (col("key"), col("bucket"), col("size"), col("lastmodifieddate"), col("etag"), col("contenttype"));
    if key.is_none() {
        return Err(Error::invalid(format!("{}: no Key column", c.source)));
    }
    let mut rd = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(&c.data[..]);
    let mut rec = csv::StringRecord::new();
    loop {
        let line = c.first_line + rd.position().line() - 1;
        let at = At { source: &c.source, line };
        if !rd.read_record(&mut rec).map_err(|e| at.bad(e))? {
            return Ok(());
        }
        let get = |i: Option<usize>| i.and_then(|i| rec.get(i)).unwrap_or("");
        let key = match c.url_keys {
            true => url_decode(get(key)),
            false => Cow::Borrowed(get(key)),
        };
        let Some(p) = at.path(under, get(bucket), &key)? else { continue };
        let entry = pb::CatalogEntry {
            size: at.size(get(size))?,
            mtime_ms: at.mtime(get(mtime))?,
            etag: get(etag).trim_matches('"').to_string(),
            content_type: get(ctype).to_string(),
            ..Default::default()
        };
        emit(p, entry)?;
    }
}

/// A URL-encoded key as S3 Inventory writes it (`+` for a space).
fn url_decode(k: &str) -> Cow<'_, str> {
    if !k.contains(['%', '+']) {
        return Cow::Borrowed(k);
    }
    Cow::Owned(
        form_urlencoded::parse(format!("k={}", k.replace('&', "%26").replace('=', "%3D")).as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default(),
    )
}

/// One JSON line of an inventory (the field names of S3 Inventory, AWS's APIs or
/// snake case; other fields are ignored).
#[derive(serde::Deserialize)]
struct JsonObject<'a> {
    #[serde(borrow, alias = "Key")]
    key: Option<Text<'a>>,
    #[serde(borrow, alias = "Bucket")]
    bucket: Option<Text<'a>>,
    #[serde(borrow, alias = "Size", alias = "content_length")]
    size: Option<Text<'a>>,
    #[serde(borrow, alias = "last_modified_date", alias = "LastModifiedDate", alias = "LastModified")]
    last_modified: Option<Text<'a>>,
    #[serde(borrow, alias = "e_tag", alias = "ETag")]
    etag: Option<Text<'a>>,
    #[serde(borrow, alias = "ContentType", alias = "content-type")]
    content_type: Option<Text<'a>>,
    #[serde(borrow, alias = "user_metadata", alias = "Metadata")]
    metadata: Option<BTreeMap<String, Text<'a>>>,
    #[serde(borrow, alias = "Tags")]
    tags: Option<BTreeMap<String, Text<'a>>>,
}

/// A JSON scalar as inventory text: a string as it is (borrowed from the line when it
/// has no escapes), a number or a boolean as written, null as nothing.
struct Text<'a>(Option<Cow<'a, str>>);

impl<'a> Text<'a> {
    fn text<'b>(t: &'b Option<Text<'a>>) -> Option<Cow<'b, str>> {
        t.as_ref().and_then(|t| t.0.as_deref()).map(Cow::Borrowed)
    }

    /// A map's entries with a value.
    fn map(m: Option<BTreeMap<String, Text<'a>>>) -> impl Iterator<Item = (String, String)> {
        m.into_iter().flatten().filter_map(|(k, v)| v.0.map(|v| (k, v.into_owned())))
    }
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<Text<'a>>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a number")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Borrowed(v))))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Owned(v.to_string()))))
            }
            fn visit_string<E>(self, v: String) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Owned(v))))
            }
            fn visit_u64<E>(self, v: u64) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Owned(v.to_string()))))
            }
            fn visit_i64<E>(self, v: i64) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Owned(v.to_string()))))
            }
            fn visit_f64<E>(self, v: f64) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Owned(v.to_string()))))
            }
            fn visit_bool<E>(self, v: bool) -> std::result::Result<Text<'a>, E> {
                Ok(Text(Some(Cow::Owned(v.to_string()))))
            }
            fn visit_unit<E>(self) -> std::result::Result<Text<'a>, E> {
                Ok(Text(None))
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(format: pb::InventoryFormat, data: &str) -> pb::InventoryChunk {
        pb::InventoryChunk {
            format: format.into(),
            source: "inv".into(),
            first_line: 7,
            data: data.as_bytes().to_vec().into(),
            ..Default::default()
        }
    }

    fn all(c: &pb::InventoryChunk) -> Result<Vec<(String, pb::CatalogEntry)>> {
        entries(Some(Objects::Chunk(c.clone())))
    }

    #[test]
    fn json_lines_become_entries_with_their_metadata_and_tags() {
        let mut c = chunk(
            pb::InventoryFormat::InventoryJsonLines,
            concat!(
                r#"{"Key": "a/b.csv", "Size": 12, "LastModifiedDate": "2026-03-01T00:00:00.000Z", "ETag": "\"e1\"", "#,
                r#""ContentType": "text/csv", "Metadata": {"X-Amz-Meta-Owner": "ann", "k": 3}, "Tags": {"t": "v"}}"#,
                "\n\n",
                r#"{"key": "dir/", "size": "1"}"#,
                "\r\n",
                r#"{"key": "c\u00e9", "size": "5", "last_modified": 1700000000000, "extra": [1, 2]}"#,
            ),
        );
        c.under = "/lake/".into();
        let got = all(&c).unwrap();
        assert_eq!(got.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(), ["/lake/a/b.csv", "/lake/cé"]);
        let e = &got[0].1;
        assert_eq!((e.size, e.etag.as_str(), e.content_type.as_str()), (12, "e1", "text/csv"));
        assert_eq!(e.mtime_ms, 1_772_323_200_000);
        assert_eq!(e.user, BTreeMap::from([("k".into(), "3".into()), ("owner".into(), "ann".into())]));
        assert_eq!(e.tags, BTreeMap::from([("t".into(), "v".into())]));
        assert_eq!((got[1].1.size, got[1].1.mtime_ms), (5, 1_700_000_000_000));
    }

    #[test]
    fn csv_records_with_url_encoded_keys_and_quoted_newlines() {
        let mut c = chunk(
            pb::InventoryFormat::InventoryCsv,
            "\"b\",\"x%2By+z%26w\",\"10\",\"2026-01-02T03:04:05.000Z\",\"\"\"abc\"\"\",\"STANDARD\"\n\
             \"b\",\"two%0Alines\",\"3\",\"\",\"e\",\"STANDARD\"\n",
        );
        c.columns = "Bucket, Key, Size, LastModifiedDate, ETag, StorageClass".split(',').map(norm_col).collect();
        c.url_keys = true;
        let got = all(&c).unwrap();
        assert_eq!(got[0].0, "/b/x+y z&w");
        assert_eq!((got[0].1.size, got[0].1.etag.as_str()), (10, "abc"));
        assert_eq!(got[1].0, "/b/two\nlines");

        // Keys as they are, one with a newline in its quoted field; errors name the line.
        let mut c = chunk(pb::InventoryFormat::InventoryCsv, "k1,1\n\"k\n2\",2\nk3,three\n");
        c.columns = vec!["key".into(), "size".into()];
        c.under = "/u".into();
        let e = all(&c).unwrap_err().to_string();
        assert!(e.contains("inv:10: size \"three\" is not a number"), "{e}");
        c.data = "k1,1\n\"k\n2\",2\n".as_bytes().to_vec().into();
        assert_eq!(all(&c).unwrap().into_iter().map(|(p, _)| p).collect::<Vec<_>>(), ["/u/k1", "/u/k\n2"]);
    }

    #[test]
    fn bad_records_are_named_by_file_and_line() {
        let c = chunk(
            pb::InventoryFormat::InventoryJsonLines,
            "{\"key\": \"a\", \"bucket\": \"b\"}\n{\"key\": \"x\", \"bucket\": \"b\", \"size\": \"many\"}\n",
        );
        let e = all(&c).unwrap_err().to_string();
        assert!(e.contains("inv:8: size \"many\" is not a number"), "{e}");
        let c = chunk(pb::InventoryFormat::InventoryJsonLines, "{\"key\": \"x\"}\n");
        assert!(all(&c).unwrap_err().to_string().contains("inv:7: no bucket for this object: give --under PATH"));
        let c = chunk(pb::InventoryFormat::InventoryJsonLines, "{\"key\": \n");
        assert!(all(&c).unwrap_err().to_string().contains("inv:7: not an inventory line"));
        let c = chunk(pb::InventoryFormat::Unspecified, "");
        assert!(all(&c).is_err());
        let mut c = chunk(pb::InventoryFormat::InventoryJsonLines, "{\"key\": \"..\"}\n");
        c.under = "/".into();
        assert!(all(&c).is_err());
    }
}

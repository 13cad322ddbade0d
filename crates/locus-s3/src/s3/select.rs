//! SelectObjectContent: the request's serializations mapped onto `locus_sql::select`, the
//! result as S3's event stream (Records, Progress when asked, Stats, End), and the one
//! mapping of select errors to S3 Select's error codes. An error before the first event
//! is the HTTP error answer; one during the stream is a request-level error event.

use std::sync::atomic::Ordering::Relaxed;

use futures::StreamExt;
use locus_sql::select::{self as sel, SelectError, SelectErrorCode};
use s3s::dto::*;
use s3s::{S3Error, S3ErrorCode, S3Request, S3Response, S3Result};

use super::{LocusS3, object_path};
use crate::s3_error;

/// The one mapping from a select error to an S3 error.
fn select_error(e: SelectError) -> S3Error {
    let code = match e.code {
        SelectErrorCode::Syntax => "ParseUnexpectedToken",
        SelectErrorCode::ColumnIndex | SelectErrorCode::UnknownColumn => "InvalidColumnIndex",
        SelectErrorCode::CsvParsing => "CSVParsingError",
        SelectErrorCode::JsonParsing => "JSONParsingError",
        SelectErrorCode::Cast => "CastFailed",
        SelectErrorCode::Unsupported => "UnsupportedSyntax",
        SelectErrorCode::BadRequest => "InvalidRequestParameter",
        SelectErrorCode::UnsupportedScanRange => "UnsupportedScanRangeInput",
        SelectErrorCode::Compression => "InvalidCompressionFormat",
        SelectErrorCode::Other => return s3_error(e.error, S3ErrorCode::NoSuchKey),
    };
    let mut err = S3Error::with_message(S3ErrorCode::Custom(code.into()), e.error.to_string());
    err.set_status_code(http::StatusCode::BAD_REQUEST);
    err
}

fn one_byte(v: Option<&String>, default: u8, what: &str) -> Result<u8, SelectError> {
    match v.map(|s| s.as_bytes()) {
        None | Some([]) => Ok(default),
        Some([b]) => Ok(*b),
        Some(_) => Err(SelectError {
            code: SelectErrorCode::BadRequest,
            error: locus_common::Error::invalid(format!("{what} must be one character")),
        }),
    }
}

fn bad(msg: &str) -> SelectError {
    SelectError { code: SelectErrorCode::BadRequest, error: locus_common::Error::invalid(msg.to_string()) }
}

/// The request's serializations in `locus_sql` terms.
fn request(path: String, r: &SelectObjectContentRequest) -> Result<sel::SelectRequest, SelectError> {
    if r.expression_type.as_str() != ExpressionType::SQL {
        return Err(bad("ExpressionType must be SQL"));
    }
    let scan_range = r
        .scan_range
        .as_ref()
        .map(|s| sel::ScanRange { start: s.start.map(|v| v.max(0) as u64), end: s.end.map(|v| v.max(0) as u64) });
    if let Some(s) = &r.scan_range
        && (s.start.is_some_and(|v| v < 0) || s.end.is_some_and(|v| v < 0))
    {
        return Err(bad("ScanRange Start and End must not be negative"));
    }
    let i = &r.input_serialization;
    let compression = match i.compression_type.as_ref().map(|c| c.as_str()) {
        None | Some(CompressionType::NONE) => sel::Compression::None,
        Some(CompressionType::GZIP) => sel::Compression::Gzip,
        Some(CompressionType::BZIP2) => sel::Compression::Bzip2,
        Some(other) => {
            return Err(SelectError {
                code: SelectErrorCode::Compression,
                error: locus_common::Error::invalid(format!("CompressionType {other}: NONE, GZIP or BZIP2")),
            });
        }
    };
    let input = match (&i.csv, &i.json, &i.parquet) {
        (Some(c), None, None) => {
            let header = match c.file_header_info.as_ref().map(|h| h.as_str()) {
                Some(FileHeaderInfo::USE) => sel::HeaderInfo::Use,
                Some(FileHeaderInfo::IGNORE) => sel::HeaderInfo::Ignore,
                _ => sel::HeaderInfo::None,
            };
            let rd = c.record_delimiter.as_deref().unwrap_or("\n");
            let record_delimiter = match rd {
                "\n" | "\r\n" => b'\n',
                s if s.len() == 1 => s.as_bytes()[0],
                _ => return Err(bad("RecordDelimiter must be one character or \\r\\n")),
            };
            sel::Input::Csv(sel::CsvInput {
                header,
                delimiter: one_byte(c.field_delimiter.as_ref(), b',', "FieldDelimiter")?,
                quote: one_byte(c.quote_character.as_ref(), b'"', "QuoteCharacter")?,
                // The default, '"', is RFC 4180's doubled quote: no escape character.
                escape: match one_byte(c.quote_escape_character.as_ref(), b'"', "QuoteEscapeCharacter")? {
                    b'"' => None,
                    e => Some(e),
                },
                comment: match c.comments.as_deref() {
                    None | Some("") => None,
                    Some(_) => Some(one_byte(c.comments.as_ref(), b'#', "Comments")?),
                },
                record_delimiter,
                allow_quoted_record_delimiter: c.allow_quoted_record_delimiter.unwrap_or(false),
            })
        }
        (None, Some(j), None) => match j.type_.as_ref().map(|t| t.as_str()) {
            Some(JSONType::DOCUMENT) => sel::Input::JsonDocument,
            _ => sel::Input::JsonLines,
        },
        (None, None, Some(_)) => sel::Input::Parquet,
        _ => return Err(bad("InputSerialization needs exactly one of CSV, JSON, Parquet")),
    };
    let o = &r.output_serialization;
    let output = match (&o.csv, &o.json) {
        (Some(c), None) => sel::Output::Csv {
            delimiter: one_byte(c.field_delimiter.as_ref(), b',', "FieldDelimiter")?,
            quote: one_byte(c.quote_character.as_ref(), b'"', "QuoteCharacter")?,
            quote_all: c.quote_fields.as_ref().is_some_and(|q| q.as_str() == QuoteFields::ALWAYS),
            record_delimiter: c.record_delimiter.clone().unwrap_or_else(|| "\n".into()),
        },
        (None, Some(j)) => {
            sel::Output::Json { record_delimiter: j.record_delimiter.clone().unwrap_or_else(|| "\n".into()) }
        }
        _ => return Err(bad("OutputSerialization needs exactly one of CSV, JSON")),
    };
    Ok(sel::SelectRequest { path, expression: r.expression.clone(), input, compression, scan_range, output })
}

pub(super) async fn select_object_content(
    gw: &LocusS3,
    req: S3Request<SelectObjectContentInput>,
) -> S3Result<S3Response<SelectObjectContentOutput>> {
    let i = &req.input;
    gw.object(&i.bucket, &i.key, false).await?;
    let path = object_path(&i.bucket, &i.key)?;
    let progress = i.request.request_progress.as_ref().and_then(|p| p.enabled).unwrap_or(false);
    let sreq = request(path, &i.request).map_err(select_error)?;
    let (rows, stats) = sel::select(gw.client.clone(), sreq).await.map_err(select_error)?;
    let records = rows.map(|r| match r {
        Ok(b) => Ok(SelectObjectContentEvent::Records(RecordsEvent { payload: Some(b) })),
        Err(e) => Err(select_error(e)),
    });
    let st = stats.clone();
    let tail = futures::stream::once(async move {
        let s = Stats {
            bytes_scanned: Some(st.scanned() as i64),
            bytes_processed: Some(st.processed() as i64),
            bytes_returned: Some(st.returned.load(Relaxed) as i64),
        };
        let mut v = Vec::new();
        if progress {
            v.push(Ok(SelectObjectContentEvent::Progress(ProgressEvent {
                details: Some(Progress {
                    bytes_scanned: s.bytes_scanned,
                    bytes_processed: s.bytes_processed,
                    bytes_returned: s.bytes_returned,
                }),
            })));
        }
        v.push(Ok(SelectObjectContentEvent::Stats(StatsEvent { details: Some(s) })));
        v.push(Ok(SelectObjectContentEvent::End(EndEvent {})));
        futures::stream::iter(v)
    })
    .flatten();
    // After an error event the stream ends: no Stats or End.
    let events = records.chain(tail).scan(false, |failed, ev| {
        if *failed {
            return futures::future::ready(None);
        }
        *failed = ev.is_err();
        futures::future::ready(Some(ev))
    });
    let out = SelectObjectContentOutput { payload: Some(SelectObjectContentEventStream::new(SyncStream::new(events))) };
    Ok(S3Response::new(out))
}

/// A `Send` stream made `Sync` (s3s asks for both; the stream is only ever polled by one
/// task).
struct SyncStream<S>(std::sync::Mutex<std::pin::Pin<Box<S>>>);

impl<S> SyncStream<S> {
    fn new(s: S) -> Self {
        SyncStream(std::sync::Mutex::new(Box::pin(s)))
    }
}

impl<S: futures::Stream + Send> futures::Stream for SyncStream<S> {
    type Item = S::Item;
    fn poll_next(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Option<S::Item>> {
        let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
        g.as_mut().poll_next(cx)
    }
}

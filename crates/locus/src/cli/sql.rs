//! `locus sql "SELECT ... FROM 'locus:///logs/*.csv'"`: SQL over Locus files (CSV with a
//! header, newline-delimited JSON, Parquet) on DataFusion; results as a table, CSV or JSON.
//! A build without the `sql` feature keeps the command and says it is left out.

use anyhow::Result;
use clap::Args;

use super::Global;

#[derive(Args)]
pub struct SqlArgs {
    /// One SQL statement. Files are tables by URL: FROM 'locus:///path/*.csv' (.csv, .json
    /// for newline-delimited JSON, .parquet); SHOW TABLES, information_schema work too.
    pub query: String,
    /// Output: table, csv or json (one object per line).
    #[arg(long, default_value = "table")]
    pub format: String,
    /// After the results, one JSON line on stderr: seconds, bytes of Locus files scanned
    /// (on workers or here), bytes of results workers sent back.
    #[arg(long)]
    pub stats: bool,
}

#[cfg(feature = "sql")]
pub fn run(g: &Global, a: &SqlArgs) -> Result<()> {
    use locus_common::Error;
    use locus_sql::Format;
    use std::sync::Arc;

    let format = Format::parse(&a.format)
        .ok_or_else(|| Error::invalid(format!("unknown --format {:?} (table, csv or json)", a.format)))?;
    let cfg = g.load_config(std::iter::empty())?;
    super::runtime()?.block_on(async move {
        let c = Arc::new(super::client(&cfg)?);
        let t = std::time::Instant::now();
        let (batches, traffic) = locus_sql::query::run_sql_counted(c, &a.query).await?;
        let mut out = std::io::stdout().lock();
        locus_sql::query::write(&batches, format, &mut out)?;
        if a.stats {
            let (scanned, returned) = traffic.get();
            let s = serde_json::json!({
                "seconds": t.elapsed().as_secs_f64(),
                "bytes_scanned": scanned,
                "bytes_returned": returned,
            });
            eprintln!("{s}");
        }
        Ok(())
    })
}

#[cfg(not(feature = "sql"))]
pub fn run(_: &Global, _: &SqlArgs) -> Result<()> {
    Err(locus_common::Error::new(
        locus_common::ErrorKind::FailedPrecondition,
        "this locus was built without SQL (cargo feature `sql`)",
    )
    .into())
}

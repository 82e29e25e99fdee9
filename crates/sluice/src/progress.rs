//! The live progress display on stderr: per table rows, rate and ETA, redrawn with bars on a
//! terminal, or a periodic log line otherwise.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_core::stats::{JobStats, StreamPhase, StreamSummary, TableSummary};
use tokio::sync::watch;

/// Runs until `done` flips, then draws a last frame. A job run beside others of one job file
/// (`targets:`, `sources:`) is `labelled` with its name: its progress goes as log lines that
/// name it (frames redrawn in place by several jobs at once would overwrite each other).
pub async fn display(stats: Arc<JobStats>, labelled: Option<String>, mut done: watch::Receiver<bool>) {
    let terminal = std::io::stderr().is_terminal() && labelled.is_none();
    let label = labelled.map_or_else(String::new, |name| format!("{name}: "));
    let interval = match std::env::var("SLUICE_PROGRESS_SECS").ok().and_then(|text| text.parse::<f64>().ok()) {
        Some(seconds) if seconds > 0.0 => Duration::from_secs_f64(seconds),
        _ if terminal => Duration::from_millis(250),
        _ => Duration::from_secs(10),
    };
    let mut drawn_lines = 0;
    let mut last_rows = (Instant::now(), 0u64);
    let mut rate = 0.0;
    let mut last_applied = (Instant::now(), 0u64);
    let mut applied_rate = 0.0;
    loop {
        let finished = tokio::select! {
            _ = tokio::time::sleep(interval) => false,
            _ = done.wait_for(|done| *done) => true,
        };
        let tables = stats.snapshot();
        let written: u64 = tables.iter().map(|table| table.rows_written).sum();
        let elapsed = last_rows.0.elapsed().as_secs_f64();
        if elapsed > 0.0 {
            // A smoothed rate, so the ETA does not jump with every batch.
            let current = (written - last_rows.1) as f64 / elapsed;
            rate = if rate == 0.0 { current } else { 0.7 * rate + 0.3 * current };
        }
        last_rows = (Instant::now(), written);
        let stream = stats.stream.summary();
        let stream = (stream.phase != StreamPhase::NotStarted).then_some(stream);
        if let Some(stream) = &stream {
            let elapsed = last_applied.0.elapsed().as_secs_f64();
            if elapsed > 0.0 {
                let current = stream.rows_applied.saturating_sub(last_applied.1) as f64 / elapsed;
                applied_rate = if applied_rate == 0.0 { current } else { 0.7 * applied_rate + 0.3 * current };
            }
            last_applied = (Instant::now(), stream.rows_applied);
        }
        if terminal {
            let mut frame = frame(&tables, rate, stats.elapsed());
            if let Some(stream) = &stream {
                let _ = writeln!(frame, "  {}", stream_line(stream, applied_rate));
            }
            let mut stderr = std::io::stderr().lock();
            if drawn_lines > 0 {
                let _ = write!(stderr, "\x1b[{drawn_lines}A\x1b[J");
            }
            let _ = stderr.write_all(frame.as_bytes());
            drawn_lines = frame.lines().count();
        } else if let Some(stream) = &stream {
            log::info!("{label}{}", stream_line(stream, applied_rate));
        } else if !tables.is_empty() {
            log::info!("{label}{}", line(&tables, rate));
        }
        if finished {
            return;
        }
    }
}

fn eta(remaining: u64, rate: f64) -> String {
    if remaining == 0 {
        return "-".into();
    }
    if rate < 1.0 {
        return "?".into();
    }
    let seconds = (remaining as f64 / rate).ceil() as u64;
    if seconds >= 3_600 {
        format!("{}h{:02}m", seconds / 3_600, seconds % 3_600 / 60)
    } else if seconds >= 60 {
        format!("{}m{:02}s", seconds / 60, seconds % 60)
    } else {
        format!("{seconds}s")
    }
}

fn frame(tables: &[TableSummary], rate: f64, elapsed: Duration) -> String {
    let width = tables.iter().map(|table| table.source.chars().count()).max().unwrap_or(5).clamp(5, 40);
    let mut output = String::new();
    let total_rate = rate.max(1.0);
    for table in tables {
        let expected = table.rows_expected.max(table.rows_written);
        let fraction = if table.splits_total > 0 && table.splits_done == table.splits_total {
            1.0
        } else if expected > 0 {
            table.rows_written as f64 / expected as f64
        } else {
            0.0
        };
        let filled = (fraction * 20.0).round() as usize;
        let bar: String = "█".repeat(filled) + &"░".repeat(20 - filled.min(20));
        let remaining = expected.saturating_sub(table.rows_written);
        let _ = writeln!(
            output,
            "  {:<width$} {bar} {:>3.0}%  {:>11} rows  {:>4} dirty  ETA {}",
            truncate(&table.source, width),
            fraction * 100.0,
            group(table.rows_written),
            table.rows_skipped,
            if fraction >= 1.0 { "done".to_owned() } else { eta(remaining, total_rate) },
        );
    }
    let written: u64 = tables.iter().map(|table| table.rows_written).sum();
    let _ =
        writeln!(output, "  {} rows in {:.1}s, {} rows/s", group(written), elapsed.as_secs_f64(), group(rate as u64));
    output
}

fn line(tables: &[TableSummary], rate: f64) -> String {
    let written: u64 = tables.iter().map(|table| table.rows_written).sum();
    let expected: u64 = tables.iter().map(|table| table.rows_expected.max(table.rows_written)).sum();
    let done = tables.iter().filter(|table| table.splits_total > 0 && table.splits_done == table.splits_total).count();
    let percent = if expected > 0 { written as f64 * 100.0 / expected as f64 } else { 0.0 };
    format!(
        "progress: {} of ~{} rows ({percent:.0}%), {} rows/s, ETA {}; tables done {done}/{}",
        group(written),
        group(expected),
        group(rate as u64),
        eta(expected.saturating_sub(written), rate),
        tables.len()
    )
}

/// The change stream's state in one line: phase, rows applied and their rate, lag, latency, and
/// the position committed in the target.
pub fn stream_line(stream: &StreamSummary, rate: f64) -> String {
    let phase = match stream.phase {
        StreamPhase::NotStarted => "not started",
        StreamPhase::CatchingUp => "catching up",
        StreamPhase::Streaming => "streaming",
    };
    let bound = |quantile: Option<u64>| match quantile {
        None => "-".to_owned(),
        Some(u64::MAX) => "> 300 s".to_owned(),
        Some(milliseconds) => format!("<= {milliseconds} ms"),
    };
    let position = stream.position.as_ref().map_or_else(String::new, |position| {
        match (position.get("file").and_then(|file| file.as_str()), position.get("position")) {
            (Some(file), Some(offset)) => format!(", at {file}:{offset}"),
            _ => format!(", at {}", sluice_core::change::brief_json(position)),
        }
    });
    format!(
        "stream: {phase}, {} rows applied in {} transactions ({} rows/s), {} s behind the source, latency p50 {} p99 {}{position}",
        group(stream.rows_applied),
        group(stream.transactions_applied),
        group(rate as u64),
        stream.lag_seconds,
        bound(stream.latency_p50_ms),
        bound(stream.latency_p99_ms)
    )
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        text.to_owned()
    } else {
        text.chars().take(width - 1).collect::<String>() + "…"
    }
}

/// 1234567 → "1,234,567".
pub fn group(number: u64) -> String {
    let digits = number.to_string();
    let mut output = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            output.push(',');
        }
        output.push(digit);
    }
    output
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_etas_read_well() {
        assert_eq!(group(1_234_567), "1,234,567");
        assert_eq!(group(999), "999");
        assert_eq!(eta(1_000, 100.0), "10s");
        assert_eq!(eta(100_000, 100.0), "16m40s");
        assert_eq!(eta(0, 100.0), "-");
    }
}

//! MySQL GTID sets (`uuid:1-5:7-9,uuid2:1-3`), kept exact: a transaction's GTID is added at its
//! commit, and gaps (transactions not yet seen, or filtered on a replica) stay gaps, so a set is
//! never flattened into a range that claims transactions it does not hold.

use std::collections::BTreeMap;
use std::fmt;

/// Per source server uuid, the sorted, disjoint, non-adjacent intervals of transaction numbers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GtidSet {
    servers: BTreeMap<String, Vec<(u64, u64)>>,
}

impl GtidSet {
    /// Parses `@@gtid_executed` text (whitespace and line breaks allowed). `None` for text that
    /// is not a GTID set.
    pub fn parse(text: &str) -> Option<GtidSet> {
        let mut set = GtidSet::default();
        for member in text.split(',').map(str::trim).filter(|member| !member.is_empty()) {
            let mut parts = member.split(':');
            let server = parts.next()?.trim().to_ascii_lowercase();
            for interval in parts {
                let (start, end) = match interval.split_once('-') {
                    Some((start, end)) => (start.trim().parse().ok()?, end.trim().parse().ok()?),
                    None => {
                        let number = interval.trim().parse().ok()?;
                        (number, number)
                    }
                };
                if start == 0 || end < start {
                    return None;
                }
                let intervals = set.servers.entry(server.clone()).or_default();
                intervals.push((start, end));
                normalize(intervals);
            }
        }
        Some(set)
    }

    /// Adds one transaction of `server` (a uuid).
    pub fn add(&mut self, server: &str, number: u64) {
        let intervals = self.servers.entry(server.to_ascii_lowercase()).or_default();
        intervals.push((number, number));
        normalize(intervals);
    }
}

/// Sorts intervals and merges the overlapping and adjacent ones.
fn normalize(intervals: &mut Vec<(u64, u64)>) {
    intervals.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(intervals.len());
    for &(start, end) in intervals.iter() {
        match merged.last_mut() {
            Some(last) if start <= last.1.saturating_add(1) => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    *intervals = merged;
}

impl GtidSet {
    /// Whether every transaction of `other` is in this set.
    pub fn includes(&self, other: &GtidSet) -> bool {
        other.servers.iter().all(|(server, intervals)| {
            let mine = self.servers.get(server).map_or(&[][..], Vec::as_slice);
            intervals.iter().all(|&(start, end)| mine.iter().any(|&(from, to)| from <= start && end <= to))
        })
    }

    /// The set as `COM_BINLOG_DUMP_GTID` carries it (intervals end exclusive). `None` when a
    /// server is not a uuid.
    pub fn sids(&self) -> Option<Vec<mysql_async::Sid<'static>>> {
        use mysql_async::{GnoInterval, Sid};
        self.servers
            .iter()
            .map(|(server, intervals)| {
                let intervals = intervals.iter().map(|&(start, end)| GnoInterval::new(start, end + 1)).collect();
                Some(Sid::new(uuid_bytes(server)?).with_intervals(intervals))
            })
            .collect()
    }
}

/// MariaDB's GTID position: per replication domain, the last transaction's sequence number, as
/// `gtid_binlog_pos` shows it (`0-1-100,1-2-7`: domain, origin server, sequence).
pub fn mariadb_sequences(text: &str) -> Option<BTreeMap<u32, u64>> {
    text.split(',')
        .map(str::trim)
        .filter(|gtid| !gtid.is_empty())
        .map(|gtid| {
            let mut parts = gtid.split('-');
            let domain = parts.next()?.parse().ok()?;
            let _server: u32 = parts.next()?.parse().ok()?;
            let sequence = parts.next()?.parse().ok()?;
            parts.next().is_none().then_some((domain, sequence))
        })
        .collect()
}

/// Whether a MariaDB GTID position holds every transaction of `mark`: in each of `mark`'s
/// domains it is at the same sequence or later (sequences grow along a domain across failovers).
pub fn mariadb_reached(position: &str, mark: &str) -> bool {
    match (mariadb_sequences(position), mariadb_sequences(mark)) {
        (Some(position), Some(mark)) => {
            mark.iter().all(|(domain, sequence)| position.get(domain).is_some_and(|at| at >= sequence))
        }
        _ => false,
    }
}

fn uuid_bytes(text: &str) -> Option<[u8; 16]> {
    let hex: Vec<u8> = text.bytes().filter(|byte| *byte != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (index, pair) in hex.chunks(2).enumerate() {
        bytes[index] = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
    }
    Some(bytes)
}

/// A server uuid from the 16 bytes a GTID event carries.
pub fn uuid(bytes: [u8; 16]) -> String {
    let hex: String = bytes.iter().map(|byte| format!("{byte:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[0..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..32])
}

impl fmt::Display for GtidSet {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (server, intervals) in &self.servers {
            if !first {
                formatter.write_str(",")?;
            }
            first = false;
            formatter.write_str(server)?;
            for &(start, end) in intervals {
                if start == end {
                    write!(formatter, ":{start}")?;
                } else {
                    write!(formatter, ":{start}-{end}")?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
    const B: &str = "4f22fb58-82db-22f2-af44-d91bba530673";

    #[test]
    fn gaps_stay_gaps_until_filled() {
        let mut set = GtidSet::parse(&format!("{A}:1-7:9-10,\n{B}:5")).unwrap();
        assert_eq!(set.to_string(), format!("{A}:1-7:9-10,{B}:5"));
        set.add(A, 12);
        assert_eq!(set.to_string(), format!("{A}:1-7:9-10:12,{B}:5"));
        set.add(A, 8);
        set.add(A, 11);
        assert_eq!(set.to_string(), format!("{A}:1-12,{B}:5"));
        set.add(B, 4);
        assert_eq!(set.to_string(), format!("{A}:1-12,{B}:4-5"));
    }

    #[test]
    fn text_that_is_not_a_set_is_refused() {
        assert!(GtidSet::parse("x:0").is_none());
        assert!(GtidSet::parse(&format!("{A}:5-3")).is_none());
        assert_eq!(GtidSet::parse("").unwrap(), GtidSet::default());
    }

    #[test]
    fn event_bytes_become_the_uuid_text() {
        let bytes = [0x3e, 0x11, 0xfa, 0x47, 0x71, 0xca, 0x11, 0xe1, 0x9e, 0x33, 0xc8, 0x0a, 0xa9, 0x42, 0x95, 0x62];
        assert_eq!(uuid(bytes), A);
        assert_eq!(uuid_bytes(A), Some(bytes));
    }

    #[test]
    fn a_set_includes_another_only_with_every_transaction_of_it() {
        let set = GtidSet::parse(&format!("{A}:1-7:9-10,{B}:5")).unwrap();
        assert!(set.includes(&GtidSet::parse(&format!("{A}:2-7,{B}:5")).unwrap()));
        assert!(!set.includes(&GtidSet::parse(&format!("{A}:7-9")).unwrap()), "8 is a gap");
        assert!(!set.includes(&GtidSet::parse(&format!("{B}:4")).unwrap()));
        assert!(set.includes(&GtidSet::default()));
        let sids = set.sids().unwrap();
        let intervals: Vec<(u64, u64)> =
            sids[0].intervals().iter().map(|interval| (interval.start(), interval.end())).collect();
        assert_eq!(intervals, vec![(1, 8), (9, 11)], "the wire's intervals end exclusive");
    }

    #[test]
    fn mariadb_positions_compare_per_domain() {
        assert!(mariadb_reached("0-2-105,1-1-7", "0-1-100,1-1-7"), "a failover changes the server, not the order");
        assert!(!mariadb_reached("0-2-99,1-1-7", "0-1-100"));
        assert!(!mariadb_reached("0-2-105", "0-1-100,1-1-7"), "a domain the position lacks");
        assert!(mariadb_reached("0-1-1", ""));
        assert!(!mariadb_reached("not a gtid", "0-1-1"));
    }
}

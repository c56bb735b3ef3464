//! Wall-clock helpers: Kubernetes `Time` values for server-set timestamps and
//! the `X-Amz-Date` format of SigV4.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use k8s_openapi::jiff::civil::DateTime;
use k8s_openapi::jiff::tz::Offset;

/// `Time` for `now + offset` seconds, truncated to whole seconds as the
/// apiserver stores it.
pub(crate) fn k8s_time_after(offset_secs: i64) -> Time {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    let secs = now.saturating_add(offset_secs);
    Time(Timestamp::from_second(secs).unwrap_or(Timestamp::UNIX_EPOCH))
}

/// `time` moved by `offset_secs` seconds (whole seconds, as stored).
pub(crate) fn shift(time: &Time, offset_secs: i64) -> Time {
    let secs = time.0.as_second().saturating_add(offset_secs);
    Time(Timestamp::from_second(secs).unwrap_or(time.0))
}

/// `Time` for now.
pub(crate) fn k8s_now() -> Time {
    k8s_time_after(0)
}

/// Parses `YYYYMMDDTHHMMSSZ` (SigV4 `X-Amz-Date`) strictly.
pub(crate) fn parse_amz_date(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let digits = |range: std::ops::Range<usize>| -> Option<i32> {
        let part = s.get(range)?;
        if !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    let year = i16::try_from(digits(0..4)?).ok()?;
    let month = i8::try_from(digits(4..6)?).ok()?;
    let day = i8::try_from(digits(6..8)?).ok()?;
    let hour = i8::try_from(digits(9..11)?).ok()?;
    let minute = i8::try_from(digits(11..13)?).ok()?;
    let second = i8::try_from(digits(13..15)?).ok()?;
    let dt = DateTime::new(year, month, day, hour, minute, second, 0).ok()?;
    let ts = Offset::UTC.to_timestamp(dt).ok()?;
    let secs = u64::try_from(ts.as_second()).ok()?;
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

/// Formats a time as `YYYYMMDD` (the date of a SigV4 credential scope).
pub(crate) fn amz_day(t: SystemTime) -> Option<String> {
    let secs = i64::try_from(t.duration_since(UNIX_EPOCH).ok()?.as_secs()).ok()?;
    let ts = Timestamp::from_second(secs).ok()?;
    let dt = Offset::UTC.to_datetime(ts);
    Some(format!("{:04}{:02}{:02}", dt.year(), dt.month(), dt.day()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amz_dates() {
        let t = parse_amz_date("20240229T235959Z").unwrap();
        assert_eq!(
            t.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            1_709_251_199
        );
        assert_eq!(amz_day(t).unwrap(), "20240229");
        for bad in [
            "20240230T000000Z",
            "2024022T0000000Z",
            "20240229 235959Z",
            "20240229T235959",
            "+0240229T235959Z",
            "",
        ] {
            assert!(parse_amz_date(bad).is_none(), "{bad}");
        }
    }
}

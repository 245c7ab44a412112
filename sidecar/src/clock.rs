//! Wall-clock time as the wire writes it: unix epoch milliseconds (deadlines, heartbeats,
//! start times). Its own module so that every part may read the clock without importing the
//! worker (which imports most of them).

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

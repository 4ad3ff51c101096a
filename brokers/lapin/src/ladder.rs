//! The ladder of retry delays: RabbitMQ expires messages only at the head of a queue, so
//! each retry queue holds one delay, and a retry waits in the queue of the next one up.

use std::time::Duration;

/// The delays retry queues hold messages for, in milliseconds: 100 ms, 250 ms, 500 ms,
/// 1 s, then each a tenth and a second longer than the last, to just past a day. A
/// delay *d* between two of them waits the upper one, at most `d + d/10 + 1 s`.
pub(crate) fn retry_tiers() -> impl Iterator<Item = Duration> {
    const DAY_MS: u64 = 24 * 3600 * 1000;
    let mut next = Some(1_000_u64);
    let from_a_second = std::iter::from_fn(move || {
        let tier = next?;
        next = (tier < DAY_MS).then(|| tier + tier / 10 + 1_000);
        Some(tier)
    });
    [100, 250, 500]
        .into_iter()
        .chain(from_a_second)
        .map(Duration::from_millis)
}

/// The retry queue delay that a retry after `after` waits: the first on the ladder that
/// is at least as long, or the longest.
pub(crate) fn retry_tier(after: Duration) -> Duration {
    let mut longest = Duration::ZERO;
    for tier in retry_tiers() {
        if tier >= after {
            return tier;
        }
        longest = tier;
    }
    longest
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_waits_at_most_a_tenth_and_a_second_longer() {
        let tiers: Vec<Duration> = retry_tiers().collect();
        assert!(tiers.windows(2).all(|pair| pair[0] < pair[1]));
        assert!(tiers.len() < 100, "{} retry queues", tiers.len());
        for millis in (0..30_000)
            .step_by(7)
            .chain((30_000..90_000_000).step_by(99_991))
        {
            let after = Duration::from_millis(millis);
            let waited = retry_tier(after);
            assert!(waited >= after, "{after:?} waits {waited:?}");
            assert!(
                waited <= after + after / 10 + Duration::from_secs(1),
                "{after:?} waits {waited:?}"
            );
        }
        assert_eq!(retry_tier(Duration::MAX), *tiers.last().unwrap());
    }
}

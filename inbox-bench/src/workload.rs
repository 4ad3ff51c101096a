//! The deliveries a measurement hands out.
//!
//! Delivery `n` is computed from `n`, so consumers share nothing but a counter. Message
//! ids are random-looking version-4 UUIDs, the common case and the hard one for a B-tree:
//! every insert lands on a random leaf page, never only on the rightmost one.

use inbox_fixtures::credit::Credit;
use uuid::Uuid;

/// Accounts the credits spread over.
pub const ACCOUNTS: i64 = 10_000;

/// One delivery of a credit message: add 1 to one account.
pub type Delivery = Credit<Uuid>;

/// One measurement's deliveries.
#[derive(Debug, Clone, Copy)]
pub struct Workload {
    /// Distinct per measurement, so that no two measurements share a message id.
    seed: u64,
    pub deliveries: u64,
    /// How many in a hundred deliveries carry a message that was already processed.
    pub duplicate_percent: u64,
}

impl Workload {
    pub fn new(seed: u64, deliveries: u64, duplicate_percent: u64) -> Self {
        Self {
            seed,
            deliveries,
            duplicate_percent,
        }
    }

    pub fn delivery(&self, n: u64) -> Delivery {
        let base = self.seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let high = splitmix64(base);
        let low = splitmix64(high);
        let account = splitmix64(low) % ACCOUNTS as u64;
        let mut bytes = [0; 16];
        bytes[..8].copy_from_slice(&high.to_be_bytes());
        bytes[8..].copy_from_slice(&low.to_be_bytes());
        Delivery {
            message_id: uuid::Builder::from_random_bytes(bytes).into_uuid(),
            account: account as i64,
            amount: 1,
        }
    }

    /// Whether delivery `n` repeats a processed message. Duplicates are spread evenly
    /// (every other delivery at 50%) so that each consumer meets the same mix.
    pub fn is_duplicate(&self, n: u64) -> bool {
        (n + 1) * self.duplicate_percent / 100 > n * self.duplicate_percent / 100
    }

    /// How many deliveries [`Workload::is_duplicate`] selects.
    pub fn duplicates(&self) -> u64 {
        self.deliveries * self.duplicate_percent / 100
    }
}

/// A fast, well-mixing 64-bit hash (Steele, Lea and Flood's SplitMix64 finaliser).
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn duplicates_are_spread_evenly_and_counted() {
        for percent in [0, 50, 100, 33] {
            let workload = Workload::new(7, 1_000, percent);
            let selected = (0..1_000).filter(|&n| workload.is_duplicate(n)).count() as u64;
            assert_eq!(selected, workload.duplicates(), "{percent}%");
        }
        let half = Workload::new(7, 10, 50);
        let pattern: Vec<bool> = (0..4).map(|n| half.is_duplicate(n)).collect();
        assert_eq!(pattern, [false, true, false, true]);
    }

    #[test]
    fn message_ids_are_distinct_within_and_across_measurements() {
        let ids: HashSet<Uuid> = [1, 2]
            .into_iter()
            .flat_map(|seed| {
                let workload = Workload::new(seed, 5_000, 0);
                (0..5_000).map(move |n| workload.delivery(n).message_id)
            })
            .collect();
        assert_eq!(ids.len(), 10_000);
        let accounts = Workload::new(3, 1, 0).delivery(0).account;
        assert!((0..ACCOUNTS).contains(&accounts));
    }
}

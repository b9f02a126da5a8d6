//! Kafka's key hashing, shared by the partitioners that hash bytes (`murmur2`,
//! `json-field`): murmur2 as Kafka's Java client computes it, the masked-positive modulo
//! `BuiltInPartitioner.partitionForKey` applies, and a round-robin spread for records
//! with nothing to hash.
//!
//! The broker compiles this same file (`weir::ingest::murmur2`, by `#[path]`) for its
//! default partitioner, so host and guests share one murmur2. Keep it free of
//! dependencies: it must build in both places.

/// Kafka's murmur2 (`org.apache.kafka.common.utils.Utils.murmur2`): 32-bit MurmurHash2
/// with seed `0x9747b28c`, reading `data` as little-endian 4-byte words. Returned as
/// Java's signed `int`.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    // Java's `seed ^ length` on an int: the length wraps the same way.
    let mut h = SEED ^ (data.len() as u32);
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        let mut k = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = words.remainder();
    if tail.len() == 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition, in `[0, partition_count)`, Kafka's default partitioner gives a record
/// whose key is `bytes`: `(murmur2(bytes) & 0x7fffffff) % partition_count`
/// (`Utils.toPositive(Utils.murmur2(key)) % n`). A `partition_count` of 0 is taken as 1.
pub fn partition_for_bytes(bytes: &[u8], partition_count: u32) -> u32 {
    (murmur2(bytes) as u32 & 0x7fff_ffff) % partition_count.max(1)
}

/// Spreads records with nothing to hash over the partitions, one after the other
/// (Kafka 2.4+ uses a sticky partition per batch and librdkafka's `murmur2_random` a
/// random one; neither is reproducible across clients, so weir does the simplest even
/// spread).
#[derive(Debug, Clone, Default)]
pub struct RoundRobin {
    next: u32,
}

impl RoundRobin {
    /// A spreader starting at partition 0.
    pub const fn new() -> Self {
        RoundRobin { next: 0 }
    }

    /// The next partition, in `[0, partition_count)` (0 taken as 1).
    pub fn next_partition(&mut self, partition_count: u32) -> u32 {
        let p = self.next % partition_count.max(1);
        self.next = self.next.wrapping_add(1);
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's `UtilsTest.testMurmur2` vectors.
    #[test]
    fn java_vectors() {
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ];
        for (k, want) in cases {
            assert_eq!(murmur2(k), want, "{:?}", String::from_utf8_lossy(k));
            assert_eq!(
                partition_for_bytes(k, 1000),
                (want as u32 & 0x7fff_ffff) % 1000
            );
        }
    }

    #[test]
    fn round_robin_visits_every_partition_in_turn() {
        let mut rr = RoundRobin::new();
        let got: Vec<u32> = (0..7).map(|_| rr.next_partition(3)).collect();
        assert_eq!(got, vec![0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(RoundRobin::new().next_partition(0), 0);
    }
}

//! Retry delays: the one module that knows the `backoff` crate.
//!
//! The retry *policy* (how many attempts, which base delay) is pure and lives in the core
//! ([`crate::core::RetryPolicy`]), so the journal and replay are deterministic. This module only
//! adds jitter to a delay the core chose, just before the engine arms the timer. `backoff` is
//! unmaintained upstream; keeping it behind this one function makes a swap cheap.

use std::time::Duration;

use backoff::backoff::Backoff;

use crate::rng::SplitMix64;

/// How the engine spreads retries out.
#[derive(Debug, Clone)]
pub enum Jitter {
    /// Random jitter of up to +25 % (the default), from `backoff`'s randomized interval.
    Random,
    /// No jitter: exact delays (deterministic simulation and replay).
    None,
    /// Seeded jitter of up to +25 %, reproducible from the generator's seed (chaos runs).
    Seeded(SplitMix64),
}

impl Jitter {
    /// The delay to wait for a retry the core scheduled `delay_ms` from now. Never shorter
    /// than `delay_ms`, so a provider's retry-after (already folded into it) is honoured.
    pub fn apply(&mut self, delay_ms: u64) -> u64 {
        match self {
            Jitter::None => delay_ms,
            Jitter::Random => {
                if delay_ms == 0 {
                    return 0;
                }
                // An interval centred on 1.125 × delay with ±11.1 % spread: [1.0, 1.25] × delay.
                let centre = Duration::from_micros(delay_ms.saturating_mul(1125));
                let mut b = backoff::ExponentialBackoffBuilder::new()
                    .with_initial_interval(centre)
                    .with_randomization_factor(0.111)
                    .with_multiplier(1.0)
                    .with_max_interval(centre * 2)
                    .with_max_elapsed_time(None)
                    .build();
                let jittered = b.next_backoff().map_or(delay_ms, |d| d.as_millis() as u64);
                jittered.max(delay_ms)
            }
            Jitter::Seeded(rng) => rng.between(delay_ms, delay_ms.saturating_add(delay_ms / 4)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_never_shortens_and_stays_within_a_quarter() {
        let mut j = Jitter::Random;
        for _ in 0..200 {
            let d = j.apply(1000);
            assert!((1000..=1250).contains(&d), "{d}");
        }
        assert_eq!(Jitter::None.apply(1234), 1234);
        let mut a = Jitter::Seeded(SplitMix64::new(7));
        let mut b = Jitter::Seeded(SplitMix64::new(7));
        for _ in 0..50 {
            let (x, y) = (a.apply(800), b.apply(800));
            assert_eq!(x, y);
            assert!((800..=1000).contains(&x));
        }
    }
}

//! Order statistics over samples, and interleaved paired sampling.
//!
//! Medians rather than means: on a shared machine the noise is one-sided (a neighbour's compile
//! only ever slows a sample down), and a median ignores the slowed minority.

use std::time::Duration;

/// The median (mean of the two middle values for an even count); NaN for no samples.
pub fn median(samples: &[f64]) -> f64 {
    percentile(samples, 50.0)
}

/// The `p`-th percentile by linear interpolation between closest ranks; NaN for no samples.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut v: Vec<f64> = samples.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = (p / 100.0).clamp(0.0, 1.0) * (v.len() - 1) as f64;
    let lo = rank.floor() as usize;
    let hi = rank.ceil() as usize;
    v[lo] + (v[hi] - v[lo]) * (rank - lo as f64)
}

/// Paired samples of a subject and its baseline, taken alternately.
#[derive(Debug, Default, Clone)]
pub struct Paired {
    /// Subject samples.
    pub subject: Vec<f64>,
    /// Baseline samples, `baseline[i]` taken next to `subject[i]`.
    pub baseline: Vec<f64>,
}

impl Paired {
    /// Takes the `i`th pair: `subject` and `baseline` one after the other, the one going first
    /// alternating with `i` so that neither always follows the other; the baseline's sample.
    pub fn take<E>(
        &mut self,
        i: usize,
        subject: &mut impl FnMut() -> Result<f64, E>,
        baseline: &mut impl FnMut() -> Result<f64, E>,
    ) -> Result<f64, E> {
        let (s, b) = if i.is_multiple_of(2) {
            let s = subject()?;
            (s, baseline()?)
        } else {
            let b = baseline()?;
            (subject()?, b)
        };
        self.subject.push(s);
        self.baseline.push(b);
        Ok(b)
    }

    /// Median of the subject samples.
    pub fn subject_median(&self) -> f64 {
        median(&self.subject)
    }

    /// Median of the baseline samples.
    pub fn baseline_median(&self) -> f64 {
        median(&self.baseline)
    }

    /// The median of the per-pair differences (subject − baseline): robust against drift in the
    /// machine's speed over the run, since each pair was measured side by side.
    pub fn added_median(&self) -> f64 {
        let d: Vec<f64> = self
            .subject
            .iter()
            .zip(&self.baseline)
            .map(|(s, b)| s - b)
            .collect();
        median(&d)
    }

    /// `p10 … p90` of the subject, for the notes.
    pub fn spread(&self, unit: &str) -> String {
        format!(
            "subject p10 {} / p90 {} {unit}; baseline p10 {} / p90 {} {unit}",
            super::fmt_num(percentile(&self.subject, 10.0)),
            super::fmt_num(percentile(&self.subject, 90.0)),
            super::fmt_num(percentile(&self.baseline, 10.0)),
            super::fmt_num(percentile(&self.baseline, 90.0)),
        )
    }
}

/// Milliseconds as f64.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_percentiles() {
        assert!(median(&[]).is_nan());
        assert_eq!(median(&[3.0]), 3.0);
        assert_eq!(median(&[5.0, 1.0, 3.0]), 3.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.0), 1.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0, 5.0], 100.0), 5.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0, 5.0], 90.0), 4.6);
    }

    #[test]
    fn paired_difference_ignores_drift() {
        // The machine slows down over the run; the subject always costs 1 more than its pair.
        let p = Paired {
            subject: vec![2.0, 3.0, 11.0, 21.0],
            baseline: vec![1.0, 2.0, 10.0, 20.0],
        };
        assert_eq!(p.added_median(), 1.0);
        assert_eq!(p.subject_median(), 7.0);
    }
}

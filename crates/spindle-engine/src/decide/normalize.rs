//! Option scores to probabilities: log-sum-exp per question, and the
//! selected option paired with its own probability.

use super::{Answer, DecideError, Kind};

/// Normalises `scores` (one per option, as log-probabilities) over the
/// options of one question. Ties go to the label that sorts first, so the
/// choice does not depend on the order the options were given in.
pub fn normalize(
    id: &str,
    kind: Kind,
    labels: &[String],
    scores: &[f64],
) -> Result<Answer, DecideError> {
    if scores.is_empty() || scores.iter().any(|s| !s.is_finite()) {
        return Err(DecideError::NotFinite(id.to_string()));
    }
    // Relative to the best score first, so large scores lose no digits.
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let ln_z = scores.iter().map(|s| (s - max).exp()).sum::<f64>().ln();
    let logprobs: Vec<f64> = scores.iter().map(|s| (s - max) - ln_z).collect();
    let probs: Vec<f64> = logprobs.iter().map(|l| l.exp()).collect();
    let best = (0..labels.len())
        .max_by(|&a, &b| {
            logprobs[a]
                .total_cmp(&logprobs[b])
                .then_with(|| labels[b].cmp(&labels[a]))
        })
        .expect("at least one option");
    let expected =
        (kind == Kind::Score).then(|| probs.iter().enumerate().map(|(i, p)| i as f64 * p).sum());
    Ok(Answer {
        id: id.to_string(),
        selected: labels[best].clone(),
        probabilities: labels.iter().cloned().zip(probs.iter().copied()).collect(),
        logprobs: labels.iter().cloned().zip(logprobs).collect(),
        confidence: probs[best],
        expected,
        kind,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("o{i}")).collect()
    }

    #[test]
    fn probabilities_sum_to_one_and_the_selected_keeps_its_own() {
        let scores = [-1.5, -0.2, -7.0, -0.2000001];
        let a = normalize("q", Kind::Choice, &labels(4), &scores).unwrap();
        let sum: f64 = a.probabilities.iter().map(|(_, p)| p).sum();
        assert!((sum - 1.0).abs() < 1e-12, "{sum}");
        assert_eq!(a.selected, "o1");
        assert_eq!(a.confidence, a.probability("o1").unwrap());
        // Against a direct softmax.
        let z: f64 = scores.iter().map(|s| s.exp()).sum();
        for (i, (_, p)) in a.probabilities.iter().enumerate() {
            assert!((p - scores[i].exp() / z).abs() < 1e-12);
        }
        assert_eq!(a.expected, None);
    }

    #[test]
    fn huge_or_tiny_scores_stay_finite() {
        let a = normalize("q", Kind::Score, &labels(3), &[-1e6, -1e6 - 1.0, -2e6]).unwrap();
        assert!(a.probabilities.iter().all(|(_, p)| p.is_finite()));
        assert!(a.logprobs.iter().all(|(_, l)| l.is_finite()));
        assert!((a.confidence - 1.0 / (1.0 + (-1.0f64).exp())).abs() < 1e-12);
        let e = a.expected.unwrap();
        assert!(e > 0.0 && e < 1.0, "{e}");
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(
                normalize("q", Kind::Choice, &labels(2), &[0.0, bad]),
                Err(DecideError::NotFinite("q".into()))
            );
        }
    }

    #[test]
    fn ties_do_not_depend_on_order() {
        let l = vec!["b".to_string(), "a".to_string()];
        let a = normalize("q", Kind::Choice, &l, &[-1.0, -1.0]).unwrap();
        let rev: Vec<String> = l.iter().rev().cloned().collect();
        let b = normalize("q", Kind::Choice, &rev, &[-1.0, -1.0]).unwrap();
        assert_eq!((a.selected.as_str(), b.selected.as_str()), ("a", "a"));
    }
}

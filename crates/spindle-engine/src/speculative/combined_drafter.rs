//! Several drafters at once: their candidates go into one tree, where shared
//! prefixes merge and the budget keeps the likeliest nodes of all of them.

use super::drafter::{Draft, Drafter};
use crate::error::EngineError;
use crate::sampler::SamplerConfig;

/// Proposes what every inner drafter proposes.
pub struct Combined {
    pub drafters: Vec<Box<dyn Drafter>>,
    name: String,
}

impl Combined {
    pub fn new(drafters: Vec<Box<dyn Drafter>>) -> Combined {
        let name = drafters
            .iter()
            .map(|d| d.name().to_string())
            .collect::<Vec<_>>()
            .join("+");
        Combined { drafters, name }
    }
}

impl Drafter for Combined {
    fn name(&self) -> &str {
        &self.name
    }

    fn propose(
        &mut self,
        history: &[u32],
        max_len: usize,
        sampler: &SamplerConfig,
    ) -> Result<Vec<Draft>, EngineError> {
        let mut all = Vec::new();
        for d in &mut self.drafters {
            all.extend(d.propose(history, max_len, sampler)?);
        }
        Ok(all)
    }

    fn begin(&mut self, tenant: &str) {
        for d in &mut self.drafters {
            d.begin(tenant);
        }
    }

    fn end(&mut self, history: &[u32], prompt_len: usize) {
        for d in &mut self.drafters {
            d.end(history, prompt_len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{NgramDrafter, TokenTree};
    use super::*;

    struct Fixed(Vec<u32>);

    impl Drafter for Fixed {
        fn name(&self) -> &str {
            "fixed"
        }
        fn propose(
            &mut self,
            _: &[u32],
            _: usize,
            _: &SamplerConfig,
        ) -> Result<Vec<Draft>, EngineError> {
            Ok(vec![Draft::uniform(self.0.clone(), 0.8)])
        }
    }

    #[test]
    fn candidates_of_all_drafters_share_one_tree() {
        let mut c = Combined::new(vec![
            Box::new(NgramDrafter::default()),
            Box::new(Fixed(vec![4, 7])),
        ]);
        assert_eq!(c.name(), "ngram+fixed");
        // n-gram: "1 2 3 ... 1 2" -> "3 4"; fixed: "4 7".
        let drafts = c
            .propose(&[1, 2, 3, 4, 1, 2], 2, &SamplerConfig::default())
            .unwrap();
        assert_eq!(drafts.len(), 2);
        let t = TokenTree::build(&drafts, 16);
        let roots: Vec<u32> = t
            .nodes
            .iter()
            .filter(|n| n.parent.is_none())
            .map(|n| n.token)
            .collect();
        assert_eq!(roots, vec![3, 4]);
    }
}

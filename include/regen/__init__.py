"""eagle3-regen: regenerate EAGLE-3 drafter training data with the target model's own token ids."""

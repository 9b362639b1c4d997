"""The verification harness: adversarial case catalogue (and, as it grows, strategies and runners)."""

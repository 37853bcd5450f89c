"""The one judge: pure scoring of chunk-size choices against measured TTFTs (the baseline lineup,
regret, savings and their bootstrap intervals, the held-out slices and the per-config records).
Training, the profiler's summary, the live races (evaluation/) and every bench score through it;
it measures nothing and imports no torch."""

"""Speculative decoding for the bundled runtime: drafters (NGRAM, STANDALONE, NEXTN/EAGLE from MTP weights),
one verify forward per round, and the per-draft state sandbox that makes rejected drafts roll back exactly."""

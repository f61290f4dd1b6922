"""The rule sets validate, doctor and launch share: cross-file rules, what each engine refuses or ignores."""

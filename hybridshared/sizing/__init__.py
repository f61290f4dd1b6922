"""The pool-sizing formula (SGLang 0.5.23's arithmetic) and the bundled runtime's inputs to it."""

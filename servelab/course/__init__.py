"""The lab's text and its tooling: the lesson registry, notebook and site builders, answer keys,
hand-in archives, and `lab`, the helpers the notebooks call."""

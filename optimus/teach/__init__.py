"""Guided walks through the predefined patterns.

:mod:`~optimus_lens.teach.data` (the walkthrough as plain data: what ``viz`` draws;
imports only the core), :mod:`~optimus_lens.teach.lookup` (patterns, teaching models,
the one-pattern pass), :mod:`~optimus_lens.teach.replay` (the search recorded as
frames), :mod:`~optimus_lens.teach.variants` (the dependent variant and the exercise),
:mod:`~optimus_lens.teach.slides` (the slides' text) and :mod:`~optimus_lens.teach.walk`
(:func:`~optimus_lens.teach.walk.walkthrough`, which builds one). Nothing is imported
here, so importing the data types reaches no pattern catalogue.
"""

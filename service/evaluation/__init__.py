"""Evaluation of private rankings against exact PPR (:mod:`service.evaluation.runner`), of
embeddings on node classification (:mod:`service.evaluation.embeddings`) and of synthetic graphs
(:mod:`service.evaluation.synthetic`). The package imports nothing itself, so that
:mod:`service.evaluation.options` stays light for the command line."""

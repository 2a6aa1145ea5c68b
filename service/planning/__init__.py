"""Planning a budget over time: how large each answer may be for a schedule of answers to fit a
cap (:mod:`service.planning.budget`), and what ranking quality that buys on a graph
(:mod:`service.planning.quality`)."""

"""The course lectures: percent-format sources in ``lectures/src`` and their executed notebooks.

``python -m lectures.build [NAMES...]`` turns ``src/NN_topic.py`` into ``NN_topic.ipynb`` with outputs.
"""

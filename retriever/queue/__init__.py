"""The experts' queue and what it reads: `question_queue.py` (the queue of one index: abstained questions grouped,
linked or answered by an expert), `unanswered.py` (the log of abstained questions) and `feedback.py` (the "Was this
helpful?" store)."""

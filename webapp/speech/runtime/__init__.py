"""The worker runtime: what a worker child does with a message, above the job lifecycle.

``delivery`` handles one message; ``claims`` is the claim policy; ``attempt``
runs one claimed job and settles it; ``batching`` runs several at once on a
GPU child; ``worker`` owns the loaded model, the heartbeat thread and the
child's signals; ``recycling`` and ``rolling`` decide when a child leaves;
``analysis`` runs the voice-prompt analysis; ``hooks`` are the points a test
may plug into. Every change of a job's state goes through ``webapp.speech.lifecycle``.
"""

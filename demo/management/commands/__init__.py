"""``seed_demo``, ``seed_attachments``, ``run_docstore``."""

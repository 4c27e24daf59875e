"""A job's data: the built-in corpus (:mod:`.stdlib_corpus`), record files (:mod:`.record_files`), instruction and
chat examples with a loss mask (:mod:`.examples`), epochs over rows (:mod:`.epochs`) and a job's rows in their
order (:mod:`.job_data`)."""

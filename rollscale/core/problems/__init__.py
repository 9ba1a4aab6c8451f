"""Problems (science §2): sources (named sets, a user's table), their rows, the 0/1 verifiers
(``rewards``; math answers are checked in a bounded worker, ``timed_worker``), a sample of a
table for ``rollscale init``, difficulty profiling (avg@k) and the buckets and splits."""

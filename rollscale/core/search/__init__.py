"""The frontier search (science §8): which key stops at which rung (``decisions``; the
stop rules a-c, the bracket, seeds where undecided), its bookkeeping (``state``), what the
fits say of a group (``view``), simulated studies (``simulate``) and a grid's replay (``replay``)."""

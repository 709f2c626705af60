"""The thread topology: every actor a thread of this process (`topology`), and the thread
group every topology's loops run in (`group`)."""

"""
The opencode side (SPEC §3, §11).

    ``probe``   is opencode answering?  (shared, bounded, cached successes)
    ``asks``    ``sandbox ask``: opencode sessions, prompts, the shared event stream,
                permissions, each computer's private opencode directory
"""

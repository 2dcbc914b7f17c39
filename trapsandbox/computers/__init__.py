"""
The computer side: one WebSocket per computer, and requests both ways (SPEC §2, §9).

    ``wire``          the four frames, close codes, capabilities, ``cut``, and the
                      errors every surface gives (``not_connected``, ``not_allowed``)
    ``parts``         file parts as binary messages, for a client that announced them
    ``session``       one admitted connection and the lifetime of each request on it
                      (Deferreds correlated by messageId, timeouts, partial responses)
    ``activity``      each computer's activity feed: its requests as they start and end
    ``hooks``         what runs around every request to a computer, in order: metrics,
                      the watch quota, screen pacing, file listeners, the activity
    ``registry``      connected computers (newest wins): which one a request goes to
    ``protocol``      the Autobahn protocol and factory: hello, dispatch, limits,
                      close codes
    ``sending``       how both WebSockets of the port send (``Sending``, shared with
                      ``web.opsocket``)
    ``outbound``      flow control of what one connection is sent
    ``streams``       every long-lived stream under one budget: how many per account,
                      how many bytes wait for one HTTP stream's reader
    ``lines``         the log under a flood: one line per interval, so many a second
    ``sandbox``       the section 9 operations on a computer (exec, eval, files, screen,
                      input, screen_watch)
    ``screen``        a screen_watch's compact frames as operators get them (SPEC §14)
    ``callers``       who is asking: one value every request to a computer carries
    ``settingsfile``  no file request reaches a computer's /.settings (its credential);
                      the twin of the Lua client's rule
    ``paths``         the one path rule: a path as CraftOS reads it (``canonical``),
                      what no request may name (``checked``), ``inside``
    ``pathlocks``     changes of one computer's overlapping paths, one after another
    ``filebudget``    the bytes of files on their way to one computer, from every write at
                      once, under one bound
"""

"""The drafter-verifier conversation of one session, free of transport and models.

A drafter opens a Verify stream for a session and sends blocks; the verifier answers each with
a verdict (``cascade.session.events``). ``DrafterSession`` (``cascade.session.drafter``) is the
drafter's side as a state machine; the gRPC pump performs its actions. Its table (phase x event
-> actions, next phase):

=========  ==========  ==============================================================  =========
phase      event       actions                                                         next
=========  ==========  ==============================================================  =========
opening    Verdict     Observe (features, plan); Receive while replies are due, else   opening,
                       Begin and Draft (or StartAlone if the plan is 0)                drafting,
                                                                                       alone
drafting   Drafted     Send the block (not if it went ahead), Receive (pre-drafting    verifying
                       for its outcomes when speculating)
verifying  CaughtUp    Relay the round decoded alone; Receive (Finish if it ends)      verifying
verifying  Verdict     Observe, Judge, Relay; Finish if it ends, StartAlone if the     drafting,
                       plan is 0, else Draft the next block (from the pre-drafts)      alone, done
alone      Verdict     Observe, Relay, Follow (shadows); Finish if it ends, StopAlone  alone,
                       and Draft if the plan is > 0, else OfferReady once and Receive  drafting
any        Stale       Fail                                                            done
any        ReadyNoted  (no more OfferReady this stretch)                               same
=========  ==========  ==============================================================  =========

Any other pair is a ``ProtocolError``. ``docs/protocol.md`` draws the sequence.
"""

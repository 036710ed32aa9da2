"""The drafter-verifier conversation of one session, free of transport and models.

A drafter opens a Verify stream for a session and sends blocks; the verifier answers each with
a verdict (``cascade.session.events``). ``DrafterSession`` (``cascade.session.drafter``) is the
drafter's side as a state machine; the gRPC pump performs its actions
(``cascade.session.actions``). Its table (phase x event
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

``VerifierSession`` (``cascade.session.verifier``), the verifier's side:

===========  =========  ===========================================================  ===========
phase        event      actions                                                      next
===========  =========  ===========================================================  ===========
new          Open       Admit (owner tag, epoch, fields, KV room)                    opening
new          other      Fail: send the open first                                    done
opening      Admitted   ReplyFeatures if asked; Plan if asked, else Read             opening,
                                                                                     waiting
opening      Planned    Reply; DecodeAlone(0) if the plan is 0, else CatchUp(0)      alone,
                                                                                     catching up
waiting      Block      Verify (the block-level rules: ``SessionTable.verify``)      verifying
verifying,   Verified   Reply (if new); DecodeAlone if it asks 0, Read if it ends,   alone,
alone,                  is stale or was dropped, else CatchUp                        waiting,
catching up                                                                          catching up
catching up  Idle       Read                                                         waiting
after open   Shadow,    Score / NoteReady (read beside the rest)                     same
             Ready
any          Ended      (release the session)                                        done
===========  =========  ===========================================================  ===========

Any other pair is a ``ProtocolError``. ``docs/protocol.md`` draws the sequence.
"""

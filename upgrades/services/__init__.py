"""Services of the upgrade bridge: snapshot and staged run (``snapshot``, ``runner``, ``dispatch``),
document reconciliation (``reconciliation``), workspace cutover and cleanup authorizations
(``cutover``, ``cleanup``)."""

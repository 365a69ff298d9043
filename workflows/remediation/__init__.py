"""The remediation workflow (`remediate-gpu-device`), one module per step of its procedure.

State machine (each step a runbook knob; phases are the `SickbayPhase` search attribute):

    received -> confirming --stale / application / ignore / dry-run----------------> closed
                    | resolve-device, gather-evidence, find-consumers, classify,
                    | pick runbook (strictest of the consumers'); the budget lease is
                    | asked meanwhile (within the strictest budget of any runbook)
                    v
                guarding --budget exhausted / unreachable--> escalated (once), stays open:
                    |   retries the lease every minute (then 5 min), absorbs repeat alerts;
                    |   ends on abort, repaired, alert resolved + Healthy -> closed,
                    |   or a granted lease -> on to approval / quarantine; a wait of days
                    |   continues-as-new and confirms afresh
                    | budget lease (sickbay-budget workflow)
                    v
          [awaiting-approval] --rejected / timeout per runbook--> escalated / closed
                    v
              quarantining   DeviceTaintRule (taint: NoExecute; eviction-api: NoSchedule,
                    |        Eviction API, NoExecute backstop after the eviction timeout)
                    v
                evicting --timeout--> force per policy --still there--> escalated ------+
                    v                                                                  |
         awaiting-replacement --Pending deadline (a timer)--> scaling                  |
                    |   churn -> escalated                 | request-capacity          |
                    |                                      | at-max / no capacity      |
                    v                                      v  -> escalated             |
               repairing   the runbook's ladder (reset / reboot / replace), each rung  |
                    |      within the budget, after its drain; then validating: the    |
                    |      validation Job on the device. Pass -> releasing (no hold);  |
                    |      fail -> next rung; none left / refused -> escalated --------+
                    |      (replace: the old GPU is gone -> releasing); a retired GPU  |
                    |      (lemon) is never repaired: held until un-retired, one RMA   |
                    v                                                                  |
                 holding <------------------------------------------------------------+
                    | per release.mode: repaired (signal), Healthy for release.cooldown, or
                    | either (healthy-cooldown: only the health releases, a repaired mark
                    | is recorded)
                    v
                releasing (remove rule, release lease, resolve page) -> closed
"""

from workflows.remediation.calls import REQUIRED_ACTIVITIES
from workflows.remediation.workflow import DeviceRemediationWorkflow

__all__ = ["REQUIRED_ACTIVITIES", "DeviceRemediationWorkflow"]

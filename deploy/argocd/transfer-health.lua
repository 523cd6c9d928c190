-- Argo CD health check for ferry.dev Transfers: Argo CD sets `obj` to the Transfer and
-- reads the table returned, {status = ..., message = ...}. The source is
-- deploy/argocd/transfer-health.lua (docs/operator.md shows it in argocd-cm);
-- tests/cluster-tests/tests/argocd_health.rs tests it.

-- The Ready condition's message, or "".
local function ready_message(st)
  for _, c in ipairs(st.conditions or {}) do
    if c.type == "Ready" and c.message ~= nil then
      return c.message
    end
  end
  return ""
end

-- "a; b", leaving out an empty part.
local function join(a, b)
  if a == "" then return b end
  if b == "" then return a end
  return a .. "; " .. b
end

local spec = obj.spec or {}
local st = obj.status or {}
local phase = st.phase or "Pending"
local message = ready_message(st)
local finished = {Succeeded = "Healthy", Failed = "Degraded"}
local running = {Pending = true, Running = true, Retrying = true}

if spec.schedule ~= nil then
  -- A scheduled Transfer: one run after another.
  if spec.suspend == true then
    return {status = "Suspended", message = join("the schedule is suspended", message)}
  end
  if finished[phase] ~= nil then
    -- Between runs: how the last one ended, and when the next one starts.
    local next_run = ""
    if st.nextRunTime ~= nil then
      next_run = "next run at " .. st.nextRunTime
    end
    return {status = finished[phase], message = join(message, next_run)}
  end
  -- A run is going: until it ends, the last finished run (history is newest first) decides.
  local last = (st.history or {})[1]
  if running[phase] and last ~= nil then
    if last.result == "Succeeded" then
      return {status = "Healthy",
              message = "run " .. tostring(st.run) .. " in progress; the last run succeeded"}
    elseif last.result == "Failed" then
      return {status = "Degraded", message = last.message or "the last run failed"}
    end
  end
end

-- A single run (or a scheduled one's first): its phase decides.
if finished[phase] ~= nil then
  return {status = finished[phase], message = message}
elseif phase == "Suspended" then
  return {status = "Suspended", message = message}
end
return {status = "Progressing", message = message}

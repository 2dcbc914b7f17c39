
local args = { ... }
if #args == 1 then print(args[1] .. ' is ' .. tostring(settings.get(args[1]))) return end
if #args ~= 2 then print('Usage: set <name> <value>') return end
local value = args[2]
if value == 'true' then value = true elseif value == 'false' then value = false
elseif tonumber(value) then value = tonumber(value) end
settings.set(args[1], value)
settings.save()
print(args[1] .. ' set to ' .. tostring(value))

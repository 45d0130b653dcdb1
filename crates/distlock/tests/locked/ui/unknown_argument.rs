#[distlock::locked(locks = locks, name = "user:{foo}")]
async fn greet(locks: &distlock::Locks, user_id: u64, greeting: String) -> distlock::Result<()> {
    let _ = (user_id, greeting);
    Ok(())
}

fn main() {}
